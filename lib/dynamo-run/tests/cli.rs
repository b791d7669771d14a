//! Flags, `in=stdin`, `in=text`, and the library entry point.

use crate::common;

use common::*;

#[test]
fn stdin_is_one_prompt_and_the_answer_goes_to_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let done = run(command(&["in=stdin", "out=echo_full"], dir.path()), "hello from stdin\nsecond line");
    assert_eq!(done.code(), Some(0), "{done:?}");
    assert_eq!(done.stdout, "hello from stdin\nsecond line\n");

    // Behind the preprocessor, echo_core echoes the templated prompt.
    let done = run(command(&["out=echo_core", "in=stdin", "--model-name", "m"], dir.path()), "core");
    assert_eq!(done.code(), Some(0), "{done:?}");
    assert_eq!(done.stdout, "<|user|>\ncore\n<|assistant|>\n\n");
}

#[test]
fn stdin_is_the_default_input_when_it_is_not_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let done = run(command(&[], dir.path()), "defaults");
    assert_eq!(done.code(), Some(0), "{done:?}");
    assert_eq!(done.stdout, "defaults\n");
    let empty = run(command(&["in=stdin"], dir.path()), "  \n");
    assert_eq!(empty.code(), Some(2), "{empty:?}");
    assert!(empty.stderr.contains("stdin is empty"), "{}", empty.stderr);
}

#[test]
fn text_mode_keeps_a_conversation_until_eof() {
    let dir = tempfile::tempdir().unwrap();
    let done = run(command(&["in=text", "out=echo_full"], dir.path()), "first\n\nsecond\n");
    assert_eq!(done.code(), Some(0), "{done:?}");
    assert_eq!(done.stdout, "> first\n> > second\n> \n");
}

#[test]
fn bad_flags_exit_2_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["--no-such-flag"], "--no-such-flag"),
        (&["--http-port", "http"], "--http-port"),
        (&["in=dyn://ns.comp.ep", "out=dyn"], "cannot be combined with out=dyn"),
        (&["in=http", "out=dyn", "--context-length", "100"], "--context-length cannot be used with out=dyn"),
        (&["in=http", "out=dyn", "--kv-cache-block-size", "32"], "--kv-cache-block-size cannot be used with out=dyn"),
        (&["in=http", "out=vllm"], "out=vllm needs --model-path"),
        (&["in=http", "out=dyn", "--router-mode", "lru"], "--router-mode"),
        (&["in=carrier-pigeon"], "unknown input"),
        (&["out=gpt"], "unknown output"),
        (&["in=dyn://only.two"], "namespace.component.endpoint"),
        (&["in=http", "out=dyn", "--resend-limit", "three"], "--resend-limit"),
        (&["in=http", "out=echo_full", "--resend-limit", "2"], "--resend-limit applies to out=dyn"),
    ];
    for (args, message) in cases {
        let done = run(command(args, dir.path()), "");
        assert_eq!(done.code(), Some(2), "{args:?}: {done:?}");
        assert!(done.stderr.contains(message), "{args:?}: {}", done.stderr);
        assert!(done.stdout.is_empty(), "{args:?}: {}", done.stdout);
    }
    // DYN_RESEND_LIMIT is read by a frontend of discovered models, and a wrong value named.
    let mut cmd = command(&["in=http", "out=dyn"], dir.path());
    cmd.env("DYN_RESEND_LIMIT", "three");
    let done = run(cmd, "");
    assert_eq!(done.code(), Some(2), "{done:?}");
    assert!(done.stderr.contains("DYN_RESEND_LIMIT=\"three\" is not a number of resends"), "{}", done.stderr);
    // Our own checks say who is speaking.
    let done = run(command(&["out=vllm"], dir.path()), "");
    assert!(done.stderr.starts_with("dynamo-run: error: "), "{}", done.stderr);
}

#[test]
fn failures_at_startup_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.json");
    let done = run(
        command(&["in=stdin", "out=mocker", "--extra-engine-args", &missing.display().to_string()], dir.path()),
        "x",
    );
    assert_eq!(done.code(), Some(1), "{done:?}");
    assert!(done.stderr.contains("dynamo-run: error:") && done.stderr.contains("missing.json"), "{}", done.stderr);

    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"blok_size": 4}"#).unwrap();
    let done =
        run(command(&["in=stdin", "out=mocker", "--extra-engine-args", &bad.display().to_string()], dir.path()), "x");
    assert_eq!(done.code(), Some(1), "{done:?}");
    assert!(done.stderr.contains("blok_size"), "{}", done.stderr);

    let done = run(command(&["in=stdin", "--model-path", "/nonexistent/model"], dir.path()), "x");
    assert_eq!(done.code(), Some(1), "{done:?}");
    assert!(done.stderr.contains("/nonexistent/model"), "{}", done.stderr);
}

#[test]
fn the_library_entry_point_returns_exit_codes() {
    assert_eq!(dynamo_run::run_cli(vec!["--version".to_string()]), 0);
    assert_eq!(dynamo_run::run_cli(vec!["--bogus".to_string()]), dynamo_run::EXIT_USAGE);
    assert_eq!(dynamo_run::run_cli(vec!["out=vllm".to_string()]), dynamo_run::EXIT_USAGE);
}
