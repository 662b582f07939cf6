//! The training monitor: CSV metrics, PNG curves (without system fonts) and the progress bar.

use genesis::monitor::MetricsLog;

fn log() -> MetricsLog {
    let mut log = MetricsLog::new();
    for step in 0..50u64 {
        let loss = 2.5 * (-(step as f64) / 15.0).exp() + 0.1;
        log.record(step, &[("train_loss", loss)]);
        if step % 10 == 9 {
            log.record(step, &[("test_accuracy", 1.0 - loss / 3.0)]);
        }
    }
    log
}

#[test]
fn csv_has_one_column_per_metric_and_empty_cells_for_gaps() {
    let log = log();
    let csv = log.to_csv();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], "step,train_loss,test_accuracy");
    assert_eq!(lines.len(), 51);
    assert!(lines[1].starts_with("0,2.6,") && lines[1].ends_with(','), "{}", lines[1]);
    let row9: Vec<&str> = lines[10].split(',').collect();
    assert_eq!(row9[0], "9");
    let acc: f64 = row9[2].parse().unwrap();
    assert_eq!(acc, log.series("test_accuracy")[0].1);
    assert_eq!(log.series("test_accuracy").len(), 5);

    let mut odd = MetricsLog::new();
    odd.record(1, &[("a,b", 1.0)]);
    assert_eq!(odd.to_csv(), "step,\"a,b\"\n1,1\n");

    let dir = std::env::temp_dir().join(format!("genesis-monitor-csv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    log.write_csv(dir.join("metrics.csv")).unwrap();
    assert_eq!(std::fs::read_to_string(dir.join("metrics.csv")).unwrap(), csv);
}

#[cfg(feature = "monitor")]
#[test]
fn png_curves_are_drawn() {
    let dir = std::env::temp_dir().join(format!("genesis-monitor-png-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("curves.png");
    log().plot_png(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    // IHDR: width 800, height 240 per metric.
    assert_eq!(u32::from_be_bytes(bytes[16..20].try_into().unwrap()), 800);
    assert_eq!(u32::from_be_bytes(bytes[20..24].try_into().unwrap()), 480);
    if let Ok(keep) = std::env::var("GENESIS_KEEP_PLOT") {
        std::fs::copy(&path, keep).unwrap();
    }
    assert!(log().plot_png(dir.join("curves.jpg")).is_err(), "only .png");
    assert!(MetricsLog::new().plot_png(dir.join("empty.png")).is_err(), "nothing to draw");
}

#[cfg(feature = "monitor")]
#[test]
fn progress_reports_loss_and_throughput() {
    let mut bar = genesis::monitor::Progress::hidden(20, "train").unit("tokens");
    for _ in 0..5 {
        bar.step(1.23456, 64);
    }
    assert_eq!(bar.position(), 5);
    assert!(bar.throughput() > 0.0);
    let msg = bar.message();
    assert!(msg.contains("loss 1.2346") && msg.contains("tokens/s"), "{msg}");
    bar.finish();
}
