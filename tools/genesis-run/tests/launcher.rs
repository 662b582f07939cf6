//! End-to-end tests of the `genesis-run` binary, with `sh -c '...'` as the ranks' program.
//!
//! Where a test depends on the order of events between ranks (a rank must have ignored
//! SIGTERM before another fails), the ranks wait on marker files rather than on sleeps, so the
//! tests stay deterministic on a loaded machine.
#![cfg(unix)]

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The launcher with its environment cleared of torchrun variables a developer may have set,
/// so that the tests see only what the launcher sets.
fn launcher() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_genesis-run"));
    for var in ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"] {
        command.env_remove(var);
    }
    command
}

/// Runs the launcher with `args` to completion; returns its output and how long it took.
fn run(args: &[&str]) -> (Output, Duration) {
    let start = Instant::now();
    let output = launcher().args(args).output().expect("the launcher starts");
    (output, start.elapsed())
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The lines of `text`, sorted: ranks run concurrently, so only the set of lines is fixed.
fn sorted_lines(text: &str) -> Vec<&str> {
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort_unstable();
    lines
}

/// A fresh, empty directory for one test's marker files, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let path = std::env::temp_dir().join(format!("genesis-run-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("temp dir");
        TempDir(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().expect("temp dir path is UTF-8")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn each_rank_gets_torchruns_environment() {
    let output = launcher()
        .env("GENESIS_RUN_TEST_KEPT", "kept")
        // A stale value from the parent must be overridden.
        .env("RANK", "99")
        .args(["--nproc-per-node", "3", "sh", "-c"])
        .arg(r#"echo "$RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR $MASTER_PORT $GENESIS_RUN_TEST_KEPT""#)
        .output()
        .expect("the launcher starts");
    assert_eq!(output.status.code(), Some(0), "stderr: {}", stderr(&output));
    assert_eq!(
        sorted_lines(&stdout(&output)),
        [
            "[rank0]: 0 0 3 3 0 127.0.0.1 29500 kept",
            "[rank1]: 1 1 3 3 0 127.0.0.1 29500 kept",
            "[rank2]: 2 2 3 3 0 127.0.0.1 29500 kept",
        ]
    );
}

#[test]
fn second_node_numbers_its_ranks_after_the_first() {
    let (output, _) = run(&[
        "--nnodes",
        "2",
        "--node-rank=1",
        "--master-addr",
        "10.1.2.3",
        "--master-port=12345",
        "--nproc-per-node",
        "2",
        "sh",
        "-c",
        r#"echo "$RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR $MASTER_PORT""#,
    ]);
    assert_eq!(output.status.code(), Some(0), "stderr: {}", stderr(&output));
    assert_eq!(
        sorted_lines(&stdout(&output)),
        ["[rank2]: 2 0 4 2 1 10.1.2.3 12345", "[rank3]: 3 1 4 2 1 10.1.2.3 12345"]
    );
}

#[test]
fn stdout_and_stderr_lines_carry_the_rank_and_a_partial_last_line_is_kept() {
    let (output, _) =
        run(&["--nproc-per-node", "2", "sh", "-c", r#"echo "out $RANK"; echo "err $RANK" >&2; printf "tail $RANK""#]);
    assert_eq!(output.status.code(), Some(0), "stderr: {}", stderr(&output));
    assert_eq!(
        sorted_lines(&stdout(&output)),
        ["[rank0]: out 0", "[rank0]: tail 0", "[rank1]: out 1", "[rank1]: tail 1"]
    );
    assert_eq!(sorted_lines(&stderr(&output)), ["[rank0]: err 0", "[rank1]: err 1"]);
    assert!(stdout(&output).ends_with('\n'));
}

#[test]
fn lines_of_concurrent_ranks_never_mix() {
    let payload = "x".repeat(300);
    let script = format!(r#"i=0; while [ $i -lt 200 ]; do echo "$RANK {payload}"; i=$((i+1)); done"#);
    let (output, _) = run(&["--nproc-per-node", "4", "sh", "-c", &script]);
    assert_eq!(output.status.code(), Some(0), "stderr: {}", stderr(&output));
    let text = stdout(&output);
    let mut per_rank = [0; 4];
    for line in text.lines() {
        let rank: usize = line
            .strip_prefix("[rank")
            .and_then(|rest| rest.get(..1))
            .and_then(|digit| digit.parse().ok())
            .unwrap_or_else(|| panic!("malformed line {line:?}"));
        assert_eq!(line, format!("[rank{rank}]: {rank} {payload}"), "a line was mixed with another");
        per_rank[rank] += 1;
    }
    assert_eq!(per_rank, [200; 4]);
}

#[test]
fn program_arguments_are_passed_through_untouched() {
    let (output, _) =
        run(&["--nproc-per-node", "1", "sh", "-c", r#"echo "$@""#, "sh", "--nproc-per-node", "7", "--help", "--"]);
    assert_eq!(output.status.code(), Some(0), "stderr: {}", stderr(&output));
    assert_eq!(stdout(&output), "[rank0]: --nproc-per-node 7 --help --\n");
}

#[test]
fn all_ranks_succeeding_gives_zero() {
    let (output, _) = run(&["--nproc-per-node", "4", "true"]);
    assert_eq!(output.status.code(), Some(0));
    assert!(output.stdout.is_empty() && output.stderr.is_empty(), "stderr: {}", stderr(&output));
}

#[test]
fn the_first_failure_stops_the_others_and_gives_its_exit_code() {
    // Rank 0 runs `sleep` as a child of its shell: stopping the rank must stop both, or the
    // sleep would hold the output pipe (and the launcher) for 30 s.
    let (output, elapsed) = run(&[
        "--nproc-per-node",
        "2",
        "sh",
        "-c",
        r#"if [ "$RANK" = 1 ]; then echo boom >&2; exit 3; fi; sleep 30; echo survived"#,
    ]);
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(3), "stderr: {err}");
    assert!(elapsed < Duration::from_secs(15), "took {elapsed:?}");
    assert!(
        err.lines().any(|l| l.starts_with("genesis-run: rank 1 (pid ")
            && l.ends_with(") exited with code 3; stopping the other ranks")),
        "stderr: {err}"
    );
    assert!(
        err.lines().any(|l| l.starts_with("genesis-run: rank 0 (pid ") && l.contains("(SIGTERM)")),
        "rank 0 was not terminated; stderr: {err}"
    );
    assert!(!stdout(&output).contains("survived"));
    // The failed rank's last words come before the launcher's report of its failure.
    let boom = err.find("[rank1]: boom\n").expect("rank 1's stderr is forwarded");
    let report = err.find("genesis-run: rank 1 (pid ").expect("the failure is reported");
    assert!(boom < report, "stderr: {err}");
}

#[test]
fn a_rank_killed_by_a_signal_gives_128_plus_the_signal() {
    let (output, _) =
        run(&["--nproc-per-node", "2", "sh", "-c", r#"if [ "$RANK" = 1 ]; then kill -KILL $$; fi; sleep 30"#]);
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(128 + 9), "stderr: {err}");
    assert!(
        err.contains("rank 1 (pid ") && err.contains(") was killed by signal 9 (SIGKILL); stopping"),
        "stderr: {err}"
    );
}

#[test]
fn a_rank_ignoring_sigterm_is_killed_after_the_grace_period() {
    let dir = TempDir::new("grace");
    // Rank 1 fails only once rank 0 ignores SIGTERM.
    let script = format!(
        r#"if [ "$RANK" = 1 ]; then
               while [ ! -e {dir}/ready ]; do sleep 0.02; done; exit 5
           fi
           trap '' TERM; touch {dir}/ready; sleep 30"#,
        dir = dir.path()
    );
    let (output, elapsed) = run(&["--timeout-grace", "1", "--nproc-per-node", "2", "sh", "-c", &script]);
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(5), "stderr: {err}");
    assert!(elapsed >= Duration::from_secs(1), "did not wait for the grace period: {elapsed:?}");
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    assert!(
        err.lines().any(|l| l.starts_with("genesis-run: rank 0 (pid ")
            && l.ends_with("was killed by signal 9 (SIGKILL) after the 1 s grace period")),
        "stderr: {err}"
    );
}

/// Starts the launcher with `ranks` ranks that print `ready` and then sleep, waits until every
/// rank is running, sends `signal` to the launcher and returns its exit code and output.
fn signal_the_launcher(signal: &str, ranks: usize, rank_script: &str) -> (Option<i32>, String, String, Duration) {
    let mut command = launcher();
    // SAFETY: signal(2) is async-signal-safe, as code between fork and exec must be. Without
    // this, a test run started in the background by a script (SIGINT ignored, which the
    // launcher keeps as nohup-style intent) would never see the launcher react to SIGINT.
    unsafe {
        command.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            libc::signal(libc::SIGTERM, libc::SIG_DFL);
            Ok(())
        });
    }
    let mut child = command
        .args(["--nproc-per-node", &ranks.to_string(), "sh", "-c", rank_script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the launcher starts");
    let mut out = BufReader::new(child.stdout.take().expect("piped stdout"));
    let mut seen = String::new();
    let mut ready = 0;
    while ready < ranks {
        let mut line = String::new();
        assert_ne!(out.read_line(&mut line).expect("read"), 0, "launcher ended early: {seen}");
        ready += usize::from(line.ends_with("ready\n"));
        seen.push_str(&line);
    }
    let start = Instant::now();
    let status =
        Command::new("kill").args([&format!("-{signal}"), &child.id().to_string()]).status().expect("kill runs");
    assert!(status.success());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).expect("read");
    let output = child.wait_with_output().expect("the launcher ends");
    (output.status.code(), seen + &rest, stderr(&output), start.elapsed())
}

#[test]
fn sigterm_to_the_launcher_is_forwarded_and_gives_143() {
    let (code, out, err, elapsed) =
        signal_the_launcher("TERM", 2, r#"trap 'echo "got TERM"; exit 0' TERM; echo ready; sleep 30 & wait"#);
    assert_eq!(code, Some(128 + 15), "stderr: {err}");
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    assert!(err.contains("genesis-run: received SIGTERM; stopping all ranks"), "stderr: {err}");
    // Both ranks saw the forwarded SIGTERM and exited on their own.
    assert_eq!(sorted_lines(&out), ["[rank0]: got TERM", "[rank0]: ready", "[rank1]: got TERM", "[rank1]: ready"]);
    assert!(err.contains("rank 0 (pid ") && err.contains("rank 1 (pid ") && err.contains("exited with code 0"));
}

#[test]
fn sigint_to_the_launcher_gives_130() {
    let (code, _, err, elapsed) = signal_the_launcher("INT", 2, "echo ready; sleep 30");
    assert_eq!(code, Some(128 + 2), "stderr: {err}");
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    assert!(err.contains("genesis-run: received SIGINT; stopping all ranks"), "stderr: {err}");
}

#[test]
fn bad_command_lines_exit_with_2_and_say_why() {
    let cases: &[(&[&str], &str)] = &[
        (&[], "missing --nproc-per-node"),
        (&["sh"], "missing --nproc-per-node"),
        (&["--nproc-per-node", "0", "true"], "positive integer"),
        (&["--nproc-per-node", "two", "true"], "invalid value 'two' for --nproc-per-node"),
        (&["--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "2", "true"], "must be below --nnodes"),
        (&["--nproc-per-node", "2"], "no program to run"),
        (&["--nproc-per-node"], "needs a value"),
        (&["--nproc-per-node", "2", "--master-port", "x", "true"], "--master-port"),
        (&["--nproc-per-node", "2", "--timeout-grace=-1", "true"], "--timeout-grace"),
        (&["--frobnicate", "true"], "unknown option '--frobnicate'"),
    ];
    for (args, message) in cases {
        let (output, _) = run(args);
        let err = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{args:?}: stderr: {err}");
        assert!(err.starts_with("genesis-run: error: ") && err.contains(message), "{args:?}: stderr: {err}");
        assert!(!err.contains("panicked"), "{args:?}: stderr: {err}");
    }
}

#[test]
fn help_prints_usage_and_exits_0() {
    let (output, _) = run(&["--help"]);
    assert_eq!(output.status.code(), Some(0));
    assert!(stdout(&output).contains("Usage:\n  genesis-run --nproc-per-node N"));
}

#[test]
fn a_missing_program_exits_with_127_and_is_named() {
    let (output, _) = run(&["--nproc-per-node", "2", "genesis-run-no-such-program"]);
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(127), "stderr: {err}");
    assert!(err.contains("genesis-run: cannot start 'genesis-run-no-such-program' for rank 0"), "stderr: {err}");
}

#[test]
fn what_a_failed_rank_left_running_is_stopped_too() {
    // Rank 1's shell exits with 4 but leaves a `sleep` that holds its output pipe: the
    // launcher must not wait 30 s for it.
    let (output, elapsed) =
        run(&["--nproc-per-node", "2", "sh", "-c", r#"if [ "$RANK" = 1 ]; then sleep 30 & exit 4; fi; sleep 30"#]);
    assert_eq!(output.status.code(), Some(4), "stderr: {}", stderr(&output));
    assert!(elapsed < Duration::from_secs(15), "took {elapsed:?}");
}
