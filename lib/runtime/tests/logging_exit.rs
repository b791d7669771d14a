//! Log lines queued for the writer thread are all written when the process exits
//! (`std::process::exit`), and none is dropped while the queue is full.

use std::process::Command;

const LINES: usize = 50_000;
const CHILD: &str = "DYN_TEST_LOGGING_CHILD";

/// Run as a child process by [`every_queued_line_reaches_stderr_at_exit`]: log
/// [`LINES`] lines as fast as possible and exit at once.
#[test]
fn child_logs_then_exits() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    dynamo_runtime::logging::init();
    for i in 0..LINES {
        tracing::info!(line = i, "logged line");
    }
    std::process::exit(0);
}

#[test]
fn every_queued_line_reaches_stderr_at_exit() {
    // The child's name in the crate's one test binary: its module path without the crate's.
    let (_, module) = module_path!().split_once("::").expect("a module of tests/integration.rs");
    let child = format!("{module}::child_logs_then_exits");
    let output = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &child, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("DYN_LOG", "info")
        .output()
        .expect("run the child");
    assert!(output.status.success(), "child failed: {output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines = stderr.lines().filter(|l| l.contains("logged line")).count();
    assert_eq!(lines, LINES, "lines written before exit");
    assert!(stderr.lines().last().is_some_and(|l| l.contains(&(LINES - 1).to_string())), "the last line comes last");
}
