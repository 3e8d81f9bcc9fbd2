//! The simulator's runs (see `squall_sim`): seeds within a time budget, each in a process of its
//! own, every failure printed with its seed, the invariant it broke, the last events of its trace
//! and the command that replays it; and the proof that a seed replays exactly.
//!
//! - `SQUALL_SIM_SEED=N`: run that seed only (what `make sim SEED=N` does), printing its trace
//!   tail and hash.
//! - `SQUALL_SIM_BUDGET_S`: the wall-clock budget of the seed sweep (default 150 s), from
//!   `SQUALL_SIM_FIRST_SEED` (default 1: `make test` runs the same seeds every time) on;
//!   `SQUALL_SIM_JOBS` runs at once (default 1, beside the other tests of `make test`).
//! - `SQUALL_SIM_TRACE=1`: print every event as it happens (with `SQUALL_SIM_SEED`).
//! - `SQUALL_SIM_STOP_AT_FIRST=1`: end the sweep at the first seed that fails.
//! - `SQUALL_SIM_CHILD_LIMIT_S`: the wall time a run may take before it is killed and reported
//!   as stuck (default 60 s).

use std::io::Write as _;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use squall_sim::Outcome;

mod entropy {
    //! The test binary answers getrandom(2) itself: on a simulation thread from the run's seed, on
    //! any other thread from the kernel. std's hash-map keys (and through them tokio's runtime
    //! seed, its `select!` choices and the product's `squall::random`) all come from here, which
    //! is what makes a run a function of its seed. Linked into this executable, the definition
    //! takes the place of the C library's for every caller in the process.
    use std::cell::Cell;

    thread_local! {
        static SEEDED: Cell<Option<u64>> = const { Cell::new(None) };
    }

    #[allow(unsafe_code)]
    #[unsafe(no_mangle)]
    pub extern "C" fn getrandom(buf: *mut libc::c_void, len: libc::size_t, flags: libc::c_uint) -> libc::ssize_t {
        let Some(mut state) = SEEDED.try_with(Cell::get).ok().flatten() else {
            // SAFETY: the caller's buffer and length, passed on to the kernel unchanged.
            return unsafe { libc::syscall(libc::SYS_getrandom, buf, len, flags) as libc::ssize_t };
        };
        // SAFETY: getrandom(2)'s contract: `buf` points to `len` writable bytes.
        let out = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) };
        for chunk in out.chunks_mut(8) {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            chunk.copy_from_slice(&z.to_le_bytes()[..chunk.len()]);
        }
        SEEDED.with(|s| s.set(Some(state)));
        len as libc::ssize_t
    }

    /// Runs `f` on a new thread whose randomness is `seed`'s.
    pub fn seeded<T: Send + 'static>(seed: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::Builder::new()
            .name(format!("sim-{seed}"))
            .stack_size(256 << 20)
            .spawn(move || {
                SEEDED.with(|s| s.set(Some(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0x1234_5678)));
                f()
            })
            .expect("a simulation thread")
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    }
}

const CHILD_ENV: &str = "SQUALL_SIM_CHILD_SEED";
const RESULT: &str = "SIM-RESULT ";

/// The child: runs the seed named in its environment (a no-op in a plain `cargo test`).
#[test]
fn child_seed() {
    let Ok(seed) = std::env::var(CHILD_ENV) else { return };
    let seed: u64 = seed.parse().expect("a seed");
    squall::logging::init_with(&std::env::var("SQUALL_SIM_LOG").unwrap_or_else(|_| "off".into()));
    let out = entropy::seeded(seed, move || squall_sim::run_seed(seed));
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{RESULT}{}", serde_json::to_string(&out).expect("json")).expect("stdout");
}

/// A run's process, with its output, or `None` as its status when it ran past `limit` of wall
/// time and was killed.
struct ChildRun {
    status: Option<std::process::ExitStatus>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

/// Runs the test binary as the child of `seed`, killed (SIGKILL: the worker turns SIGTERM into
/// a graceful stop) once it ran for `limit` of wall time.
fn spawn_child(seed: u64, limit: Duration) -> ChildRun {
    use std::io::Read as _;
    use std::process::Stdio;
    let exe = std::env::current_exe().expect("this test binary");
    let mut child = Command::new(exe)
        .args(["child_seed", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, seed.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running a simulation child");
    let drain = |mut r: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("piped stdout")));
    let err = drain(Box::new(child.stderr.take().expect("piped stderr")));
    let start = Instant::now();
    let status = loop {
        match child.try_wait().expect("waiting for a simulation child") {
            Some(st) => break Some(st),
            None if start.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    ChildRun { status, stdout: out.join().unwrap_or_default(), stderr: err.join().unwrap_or_default() }
}

/// Runs `seed` in a process of its own. A run takes seconds of wall time (the slowest of a
/// thousand seeds about 10 s); one that runs past `SQUALL_SIM_CHILD_LIMIT_S` (default 60 s) is
/// stuck where simulated time cannot advance (a task that is always ready: a busy loop), a
/// liveness failure of its own.
fn run_child(seed: u64) -> Outcome {
    let limit = Duration::from_secs(env_u64("SQUALL_SIM_CHILD_LIMIT_S", 60));
    let out = spawn_child(seed, limit);
    let stdout = String::from_utf8_lossy(&out.stdout);
    if std::env::var("SQUALL_SIM_TRACE").is_ok_and(|v| v == "1") {
        // The child echoed every event (and, with SQUALL_SIM_LOG, the product's log lines).
        for line in stdout.lines().filter(|l| !l.contains(RESULT)) {
            println!("{line}");
        }
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
    }
    let found =
        stdout.lines().find_map(|l| l.split_once(RESULT).map(|(_, j)| j)).and_then(|j| serde_json::from_str(j).ok());
    found.unwrap_or_else(|| {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail = |s: &str| {
            s.lines().rev().take(40).collect::<Vec<_>>().into_iter().rev().map(String::from).collect::<Vec<_>>()
        };
        let what = match out.status {
            Some(status) => {
                format!("the run ended without a result ({status}): a panic in the product or the simulator")
            }
            None => format!(
                "liveness: the run did not end within {} s of wall time and was killed: simulated time stopped \
                 advancing (a task always ready to run: a busy loop in the product or the simulator)",
                limit.as_secs()
            ),
        };
        Outcome { seed, violations: vec![what], tail: [tail(&stdout), tail(&stderr)].concat(), ..Outcome::default() }
    })
}

fn report(o: &Outcome) -> String {
    let mut s = format!(
        "seed {} FAILED: {}\n  scenario: {}\n  injected: {:?}\n  last events:\n",
        o.seed,
        o.violations.join("\n    "),
        o.scenario,
        o.injected
    );
    for l in o.tail.iter().rev().take(80).collect::<Vec<_>>().into_iter().rev() {
        s.push_str(&format!("    {l}\n"));
    }
    s.push_str(&format!("  replay: make sim SEED={} (trace hash {})\n", o.seed, o.trace_hash));
    s
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Seeds for the budget (or the one seed asked for), two at a time: every invariant holds in
/// every run, or the test fails printing each failing seed, its trace's last events and how to
/// replay it.
#[test]
fn seeds_hold_every_invariant() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    if let Ok(seed) = std::env::var("SQUALL_SIM_SEED") {
        let seed: u64 = seed.parse().expect("SQUALL_SIM_SEED is a number");
        let o = run_child(seed);
        for l in &o.tail {
            println!("{l}");
        }
        println!(
            "seed {seed}: trace hash {}, {} events, {} s simulated, {} records, {} deliveries, {} committed watermarks checked, injected {:?}",
            o.trace_hash,
            o.events,
            o.sim_ms / 1000,
            o.records,
            o.deliveries,
            o.committed_checks,
            o.injected
        );
        assert!(o.violations.is_empty(), "{}", report(&o));
        return;
    }
    let budget = Duration::from_secs(env_u64("SQUALL_SIM_BUDGET_S", 150));
    let first = env_u64("SQUALL_SIM_FIRST_SEED", 1);
    let jobs = env_u64("SQUALL_SIM_JOBS", 1).max(1);
    let started = Instant::now();
    // SQUALL_SIM_STOP_AT_FIRST=1: stop once a seed failed (scripts/sim-breaks times the find).
    let stop_first = std::env::var("SQUALL_SIM_STOP_AT_FIRST").is_ok_and(|v| v == "1");
    let found = AtomicBool::new(false);
    let found = &found;
    let next = Arc::new(Mutex::new(first));
    let results = Arc::new(Mutex::new(Vec::<(Outcome, Duration)>::new()));
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            let (next, results) = (next.clone(), results.clone());
            scope.spawn(move || {
                while started.elapsed() < budget && !(stop_first && found.load(Ordering::Relaxed)) {
                    let seed = {
                        let mut n = next.lock().unwrap();
                        *n += 1;
                        *n - 1
                    };
                    let t = Instant::now();
                    let o = run_child(seed);
                    if !o.violations.is_empty() {
                        found.store(true, Ordering::Relaxed);
                    }
                    results.lock().unwrap().push((o, t.elapsed()));
                }
            });
        }
    });
    let wall = started.elapsed();
    let mut results = Arc::try_unwrap(results).map(|m| m.into_inner().unwrap()).unwrap_or_default();
    results.sort_by_key(|(o, _)| o.seed);
    let worker_min: f64 = results.iter().map(|(o, _)| o.worker_ms as f64 / 60_000.0).sum();
    let sim_min: f64 = results.iter().map(|(o, _)| o.sim_ms as f64 / 60_000.0).sum();
    // How long the slowest runs took to deliver everything (simulated s from the start; the
    // producers stop at 30 s).
    let mut settle: Vec<u64> = results.iter().map(|(o, _)| o.sim_ms / 1000).collect();
    settle.sort_unstable();
    let pct = |p: usize| settle.get((settle.len() * p / 100).min(settle.len().saturating_sub(1))).copied().unwrap_or(0);
    println!("simulated time to deliver everything: median {} s, p99 {} s, max {} s", pct(50), pct(99), pct(100));
    let mut mix = std::collections::BTreeMap::<String, u64>::new();
    for (o, _) in &results {
        for (k, v) in &o.injected {
            *mix.entry(k.clone()).or_default() += v;
        }
    }
    println!(
        "simulator: {} seeds ({first}..={}) in {:.1} s wall, {jobs} at once: {:.1} seeds/min, {:.0} simulated worker-minutes per wall minute ({:.1} fleet-minutes simulated); {} committed watermarks checked, {} windows fired; {} runs of 2 stages, {} of 3; faults injected: {mix:?}",
        results.len(),
        results.last().map_or(first, |(o, _)| o.seed),
        wall.as_secs_f64(),
        results.len() as f64 / wall.as_secs_f64() * 60.0,
        worker_min / wall.as_secs_f64() * 60.0,
        sim_min,
        results.iter().map(|(o, _)| o.committed_checks).sum::<u64>(),
        results.iter().map(|(o, _)| o.firings).sum::<u64>(),
        results.iter().filter(|(o, _)| o.stages == 2).count(),
        results.iter().filter(|(o, _)| o.stages == 3).count(),
    );
    // The runs held because the faults happened: a sweep of 50 seeds or more injected every kind.
    if results.len() >= 50 {
        let kinds = [
            "crash",
            "freeze",
            "partition from zk",
            "join",
            "split",
            "merge",
            "kinesis throttled",
            "listing omits a shard",
            "zk lost before",
            "zk lost after",
            "dynamodb throttled",
            "dynamodb answer lost",
            "deactivate",
            "drain",
            "kinesis put answer lost",
            "kinesis put record throttled",
            "kpl user record outside its shard",
            "leave",
        ];
        let missing: Vec<&str> = kinds.iter().copied().filter(|k| mix.get(*k).copied().unwrap_or(0) == 0).collect();
        assert!(missing.is_empty(), "{} seeds injected none of: {missing:?} ({mix:?})", results.len());
        let committed: u64 = results.iter().map(|(o, _)| o.committed_checks).sum();
        assert!(committed > 0, "{} seeds checked no committed watermark", results.len());
        let firings: u64 = results.iter().map(|(o, _)| o.firings).sum();
        assert!(firings > 0, "{} seeds fired no window", results.len());
        for n in [2, 3] {
            assert!(
                results.iter().any(|(o, _)| o.stages == n),
                "{} seeds ran no topology of {n} stages",
                results.len()
            );
        }
    }
    let failed: Vec<&Outcome> = results.iter().map(|(o, _)| o).filter(|o| !o.violations.is_empty()).collect();
    let text: String = failed.iter().map(|o| report(o)).collect();
    assert!(failed.is_empty(), "{} of {} seeds broke an invariant:\n{text}", failed.len(), results.len());
    assert!(!results.is_empty(), "no seed ran within the budget");
}

/// Seeds that caught a bug, each with the break (`scripts/breaks/NAME.patch`) it fails with;
/// today's code holds every invariant in each. A seed is a regression test of today's simulator:
/// a change to what a seed draws (the scenario, the faults) moves its runs, and `scripts/sim-breaks`
/// finds the seeds again.
const FOUND: &[(u64, &str)] = &[
    (1, "fencing, fire-early, stream-identity, firer-round-error, kpl-drop, firer-open-retry"),
    (2, "parent-before-child, start-zk-away, deactivate-ignored"),
    (3, "efo-renewal, efo-resume-skip, the EFO reader's busy loop while paused"),
    (5, "exact-dedup, firer-own-replay"),
    (8, "stage-start-no-retry"),
    (10, "watermark-unread-child"),
    (12, "activate-over-drain"),
    (13, "listing-gap-watermark"),
    (18, "start-lost-answer, writer-register-once"),
    (19, "efo-watchdog"),
    (20, "start-session-expiry"),
    (33, "committed-inflight"),
    (38, "production-dedup"),
    (40, "follower-spin"),
    (41, "latest-worker-clock"),
    (42, "listing-drops-shard"),
    (43, "production-first-id"),
    (50, "start-open-partition, start-joins-drain"),
    (58, "zombie-new-session"),
    (94, "floor-at-once"),
    (124, "rebalance-restore"),
    (138, "ghost-registration"),
    (143, "gc-one-listing"),
    (189, "zombie-emits"),
    (223, "drain-inactive-stages"),
    (244, "start-watch-gap"),
    (511, "firer-connect-give-up"),
    (738, "latest-closed-finished"),
    (1180, "zombie-drains-late"),
    (1487, "firer-open-session"),
    (1698, "obey-lost-read"),
    (2044, "production-floor-scope"),
    (2498, "listing-orphan-parent"),
    (4637, "the EFO reader's closed-shard fallback polling after a continuation that names no record"),
    (5791, "a worker's start stopped by its lifecycle watch refused through a partition"),
];

/// Every seed of [`FOUND`] holds every invariant on today's code.
#[test]
fn found_seeds_hold() {
    if std::env::var(CHILD_ENV).is_ok() || std::env::var("SQUALL_SIM_SEED").is_ok() {
        return;
    }
    // `SQUALL_SIM_JOBS` seeds at a time (default 2): one process each.
    let jobs = env_u64("SQUALL_SIM_JOBS", 2).max(1) as usize;
    let next = Mutex::new(FOUND.iter());
    let failed = Mutex::new(Vec::<String>::new());
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| {
                loop {
                    let Some((seed, what)) = next.lock().unwrap().next() else { return };
                    let o = run_child(*seed);
                    if !o.violations.is_empty() {
                        failed.lock().unwrap().push(format!("(found by: {what})\n{}", report(&o)));
                    }
                }
            });
        }
    });
    let failed = failed.into_inner().unwrap();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// Determinism: a seed run twice (two processes) gives the same trace, event for event.
#[test]
fn a_seed_replays_its_trace_exactly() {
    if std::env::var(CHILD_ENV).is_ok() || std::env::var("SQUALL_SIM_SEED").is_ok() {
        return;
    }
    let seed = env_u64("SQUALL_SIM_REPLAY_SEED", 3);
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| run_child(seed));
        let b = s.spawn(|| run_child(seed));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert!(a.events > 1000, "seed {seed} ran: {} events\n{}", a.events, report(&a));
    assert_eq!(
        (a.trace_hash.as_str(), a.events, a.deliveries),
        (b.trace_hash.as_str(), b.events, b.deliveries),
        "seed {seed} ran twice gave two traces; the first's last events:\n{}\nthe second's:\n{}",
        a.tail.join("\n"),
        b.tail.join("\n")
    );
}
