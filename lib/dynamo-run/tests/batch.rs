//! `in=batch:FILE.jsonl`: output lines, token counts, finish reasons, malformed lines.

use crate::common;

use common::*;

fn read_output(dir: &std::path::Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(dir.join("output.jsonl")).expect("output.jsonl");
    text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line ({e}): {l}"))).collect()
}

#[test]
fn echo_full_batch_writes_one_line_per_prompt_and_skips_malformed_lines() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("prompts.jsonl");
    let prompts = ["hello", "héllo wörld 🦀", "three"];
    let text = format!(
        "{}\n{{\"txt\": \"wrong key\"}}\n\n{}\nnot json\n{}\n",
        serde_json::json!({"text": prompts[0]}),
        serde_json::json!({"text": prompts[1]}),
        serde_json::json!({"text": prompts[2]})
    );
    std::fs::write(&input, text).unwrap();
    let arg = format!("in=batch:{}", input.display());
    let done = run(command(&[&arg, "out=echo_full"], dir.path()), "");
    assert_eq!(done.code(), Some(0), "{done:?}");
    // Line numbers of the skipped lines (blank lines are not errors).
    assert!(done.stderr.contains("prompts.jsonl:2: skipped"), "{}", done.stderr);
    assert!(done.stderr.contains("prompts.jsonl:5: skipped"), "{}", done.stderr);
    assert!(done.stdout.contains("batch: 3 prompts (0 failed)"), "{}", done.stdout);
    assert!(done.stdout.contains("tokens out: "), "{}", done.stdout);

    let lines = read_output(dir.path());
    assert_eq!(lines.len(), 3);
    for (line, prompt) in lines.iter().zip(prompts) {
        let chars = prompt.chars().count() as u64;
        assert_eq!(line["text"], prompt);
        assert_eq!(line["response"], prompt, "echo_full echoes the prompt");
        assert_eq!(line["tokens_in"], chars, "{line}");
        assert_eq!(line["tokens_out"], chars, "{line}");
        assert_eq!(line["finish_reason"], "stop");
        assert!(line["elapsed_ms"].is_u64(), "{line}");
        assert!(line.get("error").is_none());
    }
}

#[test]
fn mocker_batch_counts_tokens_and_stops_at_max_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    let prompts = ["a prompt for the mocker", "another one"];
    let text: String = prompts.iter().map(|p| format!("{}\n", serde_json::json!({"text": p}))).collect();
    std::fs::write(&input, text).unwrap();
    let args_file = dir.path().join("mocker.json");
    std::fs::write(&args_file, r#"{"speedup_ratio": 100.0, "num_gpu_blocks": 64}"#).unwrap();
    let arg = format!("in=batch:{}", input.display());
    let extra = args_file.display().to_string();
    let done = run(
        command(
            &[&arg, "out=mocker", "--max-tokens", "7", "--extra-engine-args", &extra, "--kv-cache-block-size", "8"],
            dir.path(),
        ),
        "",
    );
    assert_eq!(done.code(), Some(0), "{done:?}");
    let lines = read_output(dir.path());
    assert_eq!(lines.len(), 2);
    for (line, prompt) in lines.iter().zip(prompts) {
        // The built-in card: one token per byte of the templated prompt.
        let templated = format!("<|user|>\n{prompt}\n<|assistant|>\n");
        assert_eq!(line["text"], prompt);
        assert_eq!(line["tokens_in"], templated.len() as u64, "{line}");
        assert_eq!(line["tokens_out"], 7, "{line}");
        assert_eq!(line["finish_reason"], "length", "{line}");
        assert!(line["response"].is_string(), "{line}");
    }
}

#[test]
fn a_missing_batch_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.jsonl");
    let done = run(command(&[&format!("in=batch:{}", missing.display())], dir.path()), "");
    assert_eq!(done.code(), Some(1), "{done:?}");
    assert!(done.stderr.contains("dynamo-run: error:") && done.stderr.contains("nope.jsonl"), "{}", done.stderr);
}
