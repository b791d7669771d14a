//! Running the `dynamo-run` binary in tests: bounded waits, stdout read line by line,
//! a tiny HTTP/1.1 client, and processes that are killed when dropped.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Bound on every wait.
pub const WAIT: Duration = Duration::from_secs(30);

/// A `dynamo-run` command with a quiet, fast environment: no echo delay, discovery in
/// `kv_dir` (the `file` backend), loopback only.
pub fn command(args: &[&str], kv_dir: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dynamo-run"));
    cmd.args(args)
        .env("DYN_TOKEN_ECHO_DELAY_MS", "0")
        .env("DYN_DISCOVERY_BACKEND", "file")
        .env("DYN_FILE_KV", kv_dir)
        .env("DYN_TCP_HOST", "127.0.0.1")
        .env("DYN_SHUTDOWN_TIMEOUT", "2")
        .env("DYN_LEASE_TTL", "2")
        .env("DYN_LOG", "warn");
    cmd
}

/// What a finished run printed.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }
}

/// Run to the end with `stdin` as input, within [`WAIT`].
pub fn run(mut cmd: Command, stdin: &str) -> Finished {
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn dynamo-run");
    let mut input = child.stdin.take().expect("stdin");
    let text = stdin.to_string();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(text.as_bytes());
    });
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let status = wait_for_exit(&mut child, WAIT).unwrap_or_else(|| {
        let _ = child.kill();
        panic!("dynamo-run did not finish within {WAIT:?}");
    });
    let _ = writer.join();
    Finished { status, stdout: out_reader.join().unwrap_or_default(), stderr: err_reader.join().unwrap_or_default() }
}

/// Poll for the child's exit, at most `limit`.
pub fn wait_for_exit(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A long-running `dynamo-run` (a server or a worker); killed when dropped.
pub struct Server {
    child: Child,
    lines: mpsc::Receiver<String>,
    pub name: String,
}

impl Server {
    /// Start `cmd` and wait for its stdout line containing `ready`; returns the line too.
    pub fn start(name: &str, mut cmd: Command, ready: &str) -> (Server, String) {
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        let mut child = cmd.spawn().expect("spawn dynamo-run");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut server = Server { child, lines, name: name.to_string() };
        let line = server.wait_for_line(ready);
        (server, line)
    }

    /// The next stdout line containing `needle`, within [`WAIT`].
    pub fn wait_for_line(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => continue,
                Err(_) => {
                    let status = self.child.try_wait();
                    panic!("{}: no stdout line with '{needle}' (process status {status:?})", self.name);
                }
            }
        }
    }

    /// Send SIGTERM and wait for the exit, within [`WAIT`].
    pub fn terminate(mut self) -> ExitStatus {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().expect("run kill");
        assert!(sent.success(), "kill -TERM {pid}");
        wait_for_exit(&mut self.child, WAIT).unwrap_or_else(|| panic!("{} did not stop after SIGTERM", self.name))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The address in a `serving http on ADDR (...)` line.
pub fn http_address(line: &str) -> SocketAddr {
    let rest = line.split("serving http on ").nth(1).unwrap_or_else(|| panic!("not a serving line: {line}"));
    let addr = rest.split_whitespace().next().unwrap_or_default();
    addr.parse().unwrap_or_else(|e| panic!("bad address '{addr}' in '{line}': {e}"))
}

/// A whole HTTP response.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub body: String,
}

impl Response {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// One HTTP/1.1 request (`Connection: close`), read to the end, within [`WAIT`].
pub fn http(addr: SocketAddr, method: &str, path: &str, body: Option<&serde_json::Value>) -> Response {
    let mut stream = TcpStream::connect_timeout(&addr, WAIT).expect("connect");
    stream.set_read_timeout(Some(WAIT)).expect("timeout");
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).and_then(|_| stream.write_all(body.as_bytes())).expect("send");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("read response");
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or_else(|| panic!("no header end: {raw:?}"));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let body = &raw[split + 4..];
    let status =
        head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no status: {head}"));
    let body =
        if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { unchunk(body) } else { body.to_vec() };
    Response { status, body: String::from_utf8_lossy(&body).into_owned() }
}

fn unchunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = body.windows(2).position(|w| w == b"\r\n") {
        let size = String::from_utf8_lossy(&body[..eol]).trim().to_string();
        let Ok(n) = usize::from_str_radix(&size, 16) else { break };
        let rest = &body[eol + 2..];
        if n == 0 || rest.len() < n {
            break;
        }
        out.extend_from_slice(&rest[..n]);
        body = rest[n..].strip_prefix(b"\r\n").unwrap_or(&rest[n..]);
    }
    out
}

/// POST a chat request for `model` with one user message.
pub fn chat(addr: SocketAddr, model: &str, text: &str, extra: serde_json::Value) -> Response {
    let mut body = serde_json::json!({"model": model, "messages": [{"role": "user", "content": text}]});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    http(addr, "POST", "/v1/chat/completions", Some(&body))
}

/// Poll `/v1/models` until it lists `model`, within [`WAIT`].
pub fn wait_for_model(addr: SocketAddr, model: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        let models = http(addr, "GET", "/v1/models", None).json();
        let listed = models["data"].as_array().is_some_and(|d| d.iter().any(|m| m["id"] == model));
        if listed {
            return;
        }
        assert!(Instant::now() < deadline, "model '{model}' never appeared: {models}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
