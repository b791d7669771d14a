#!/usr/bin/env bash
# The README's quick-start command, run as a user would: in a fresh virtual environment,
# from this checkout, with no protoc. It builds and installs the wheel and starts the
# server; this script then sends the README's requests, checks the answers and stops it.
# Bounded: QUICKSTART_TIMEOUT seconds (default 2400) for the build and the first answer.
# QUICKSTART_PORT replaces the README's port (when it is taken).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python}"
timeout_s="${QUICKSTART_TIMEOUT:-2400}"
# The release build is cached here between CI runs (a user's goes to target/).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/dynamo-target}"
# Nothing may run protoc: a build script that tried would fail on this path.
export PROTOC=/nonexistent/protoc

# The first line of the fenced block after a marker, without its trailing comment.
block_after() { awk -v marker="<!-- $1 -->" '$0 == marker {m=1; next} m && /^```/ {if (b) exit; b=1; next} b {print}' README.md; }
command="$(block_after quickstart | head -n 1 | sed 's/[[:space:]]*#.*$//')"
requests="$(block_after quickstart-requests)"
[[ "$command" == *"pip install"*"dynamo-run"* ]] || { echo "no quick-start command in README.md: '$command'"; exit 1; }
port="$(grep -o -- '--http-port [0-9]*' <<<"$command" | awk '{print $2}')"
echo "README's quick-start command: $command"
if [ -n "${QUICKSTART_PORT:-}" ]; then  # another port than the README's, the same otherwise
    command="${command//--http-port $port/--http-port $QUICKSTART_PORT}"
    requests="${requests//localhost:$port/localhost:$QUICKSTART_PORT}"
    port="$QUICKSTART_PORT"
fi
if curl -s "localhost:$port" >/dev/null 2>&1; then
    echo "port $port is already in use (set QUICKSTART_PORT to use another)"; exit 1
fi

work="$(mktemp -d)"
"$PYTHON" -m venv "$work/venv"
log="$work/quickstart.log"
# The command runs in its own process group so that stopping it stops the server too.
setsid bash -c "source '$work/venv/bin/activate' && $command" >"$log" 2>&1 &
pid=$!
cleanup() {
    kill -TERM -- "-$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL -- "-$pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

start=$SECONDS
until curl -sf "localhost:$port/v1/models" >/dev/null 2>&1; do
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "the quick-start command exited before serving:"; tail -n 60 "$log"; exit 1
    fi
    if (( SECONDS - start > timeout_s )); then
        echo "no answer on port $port within ${timeout_s}s:"; tail -n 60 "$log"; exit 1
    fi
    sleep 2
done
echo "built, installed and serving after $(( SECONDS - start ))s ($(grep -c 'Compiling' "$log" || true) crates compiled)"

# The README's requests, as written (continuation lines joined).
# (curl's progress meter, on stderr, is dropped; a failure shows in the answers below.)
models="$(bash -c "$(grep '^curl localhost:[0-9]*/v1/models' <<<"$requests")" 2>/dev/null)"
chat="$(bash -c "$(sed -n '/v1\/chat\/completions/,$p' <<<"$requests")" 2>/dev/null)"
grep -q '"object":"list"' <<<"$models" || { echo "unexpected /v1/models answer: $models"; exit 1; }
grep -q '^data: \[DONE\]' <<<"$chat" && grep -q '"chat.completion.chunk"' <<<"$chat" \
    || { echo "unexpected chat stream: $chat"; exit 1; }
echo "quick start: /v1/models and the streamed chat completion answered as documented"
