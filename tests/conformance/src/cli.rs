//! Command line: `genesis-conformance --backend <name|path> [--device N] [--tier smoke|core|full]
//! [--filter GLOB]... [--json FILE] [--junit FILE] [--expectations FILE]
//! [--isolation process|none] [--timeout SECONDS] [--require DTYPES] [--list] [--quiet]`.

use crate::case::Tier;
use crate::expectations::Expectations;
use crate::report::{json_report, junit_report, terminal_report, Run};
use crate::runner::{run, selected_cases, worker, Isolation, RunConfig};
use crate::target::Target;
use std::time::{Duration, Instant};

/// Exit code: every case of the tier passed (or was not supported / expected), and the claims
/// cover the required set of every dtype given to `--require`.
pub const EXIT_OK: i32 = 0;
/// Exit code: at least one unexpected failure, or a `--require` dtype whose required set the
/// claims do not cover.
pub const EXIT_FAILED: i32 = 1;
/// Exit code: bad usage, or the backend could not be loaded.
pub const EXIT_USAGE: i32 = 2;

const USAGE: &str = "usage: genesis-conformance --backend <name|path-to-plugin> [--device N] [--tier smoke|core|full]
       [--filter GLOB]... [--json FILE] [--junit FILE] [--expectations FILE]
       [--isolation process|none] [--timeout SECONDS] [--require f32,f64,...] [--list] [--quiet]";

/// Parsed arguments.
#[derive(Debug, Clone)]
pub struct Args {
    /// Run configuration.
    pub cfg: RunConfig,
    /// `--json`.
    pub json: Option<String>,
    /// `--junit`.
    pub junit: Option<String>,
    /// `--list`: print the selected case ids and exit.
    pub list: bool,
    /// `--quiet`: no per-case progress lines.
    pub quiet: bool,
    /// `--ids-file` (worker mode).
    pub worker_ids: Option<String>,
}

/// Parse `args` (without the program name).
pub fn parse(args: &[String]) -> Result<Args, String> {
    let mut it = args.iter();
    let mut backend = None;
    let (mut device, mut tier, mut filters) = (0usize, Tier::Core, Vec::new());
    let (mut json, mut junit, mut expectations, mut list, mut quiet) = (None, None, None, false, false);
    let (mut isolation, mut timeout, mut worker_flag, mut worker_ids) = (Isolation::Process, 60.0f64, false, None);
    let mut require = Vec::new();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().cloned().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--backend" => backend = Some(value("--backend")?),
            "--device" => device = value("--device")?.parse().map_err(|_| "--device takes a non-negative integer")?,
            "--tier" => tier = Tier::parse(&value("--tier")?).ok_or("--tier is smoke, core or full")?,
            "--filter" => filters.push(value("--filter")?),
            "--json" => json = Some(value("--json")?),
            "--junit" => junit = Some(value("--junit")?),
            "--expectations" => expectations = Some(Expectations::load(&value("--expectations")?)?),
            "--isolation" => {
                isolation = match value("--isolation")?.as_str() {
                    "process" => Isolation::Process,
                    "none" => Isolation::None,
                    _ => return Err("--isolation is process or none".into()),
                }
            }
            "--timeout" => {
                timeout = value("--timeout")?.parse().map_err(|_| "--timeout takes seconds")?;
                if !(timeout > 0.0 && timeout < 1e6) {
                    return Err("--timeout must be positive".into());
                }
            }
            "--require" => {
                for dtype in crate::required::parse_dtypes(&value("--require")?)? {
                    if !require.contains(&dtype) {
                        require.push(dtype);
                    }
                }
            }
            "--list" => list = true,
            "--quiet" => quiet = true,
            "--worker" => worker_flag = true,
            "--ids-file" => worker_ids = Some(value("--ids-file")?),
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument `{other}`\n{USAGE}")),
        }
    }
    if worker_flag != worker_ids.is_some() {
        return Err("--worker and --ids-file go together (internal)".into());
    }
    let backend = backend.ok_or_else(|| format!("--backend is required\n{USAGE}"))?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    Ok(Args {
        cfg: RunConfig {
            backend,
            device,
            tier,
            filters,
            isolation,
            timeout: Duration::from_secs_f64(timeout),
            expectations,
            require,
            exe,
        },
        json,
        junit,
        list,
        quiet,
        worker_ids,
    })
}

/// Run the CLI; returns the exit code.
pub fn main(args: &[String]) -> i32 {
    let args = match parse(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return EXIT_USAGE;
        }
    };
    let target = match Target::open(&args.cfg.backend, args.cfg.device) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("genesis-conformance: cannot test backend `{}`: {e}", args.cfg.backend);
            return EXIT_USAGE;
        }
    };
    if let Some(ids) = &args.worker_ids {
        return match worker(&target, ids) {
            Ok(()) => EXIT_OK,
            Err(e) => {
                eprintln!("worker: {e}");
                EXIT_USAGE
            }
        };
    }
    if args.list {
        for case in selected_cases(&target, &args.cfg) {
            println!("{}", case.id);
        }
        return EXIT_OK;
    }
    if !args.cfg.filters.is_empty() && selected_cases(&target, &args.cfg).is_empty() {
        // Zero cases would read as CONFORMANT; a filter that matches nothing is a mistake.
        eprintln!(
            "no case of this tier matches --filter {}: filters are globs on whole case ids (`nn/swiglu/*`, \
             `*swiglu*`); --list shows the ids",
            args.cfg.filters.join(", ")
        );
        return EXIT_USAGE;
    }
    let start = Instant::now();
    let quiet = args.quiet;
    let results = run(&target, &args.cfg, |r| {
        if !quiet && r.outcome.status.is_failure() {
            eprintln!("{:<8} {}", r.outcome.status.name(), r.id);
        }
    });
    let report = Run { target: &target, cfg: &args.cfg, results: &results, duration_ms: start.elapsed().as_millis() };
    print!("{}", terminal_report(&report));
    let mut code = if report.conformant() && report.requirement_met() { EXIT_OK } else { EXIT_FAILED };
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&json_report(&report)).unwrap_or_default();
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("cannot write {path}: {e}");
            code = EXIT_USAGE;
        }
    }
    if let Some(path) = &args.junit {
        if let Err(e) = std::fs::write(path, junit_report(&report)) {
            eprintln!("cannot write {path}: {e}");
            code = EXIT_USAGE;
        }
    }
    code
}
