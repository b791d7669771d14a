//! What `dynamo-run` itself prints: notes and errors on stderr (`dynamo-run: …`), status
//! lines and answers on stdout. A closed stdout or stderr is not an error worth a panic.

use std::io::Write;

/// A note on stderr: `dynamo-run: {message}`.
pub fn note(message: &str) {
    let _ = writeln!(std::io::stderr().lock(), "dynamo-run: {message}");
}

/// An error on stderr: `dynamo-run: error: {message}`.
pub fn error(message: &str) {
    let _ = writeln!(std::io::stderr().lock(), "dynamo-run: error: {message}");
}

/// A status line on stdout (`dynamo-run: {message}`), flushed at once so that a parent
/// process reading the pipe sees it.
pub fn status(message: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "dynamo-run: {message}");
    let _ = out.flush();
}
