"""The README's SDK snippet, as a user would paste it: its blocks are the files of
examples/sdk_quickstart, and the pasted files run under `dynamo serve` and answer the
README's curl with the output the README shows."""

from __future__ import annotations

import asyncio
import re
import shlex
import signal
import sys
import urllib.request

import pytest
from helpers import READY_TIMEOUT, REPO_ROOT, free_port

README = REPO_ROOT / "README.md"
#: `<!-- snippet: NAME -->` followed by a fenced code block.
SNIPPET = re.compile(r"<!-- snippet: (\S+) -->\n```\w*\n(.*?)```", re.DOTALL)
STOP_TIMEOUT = 30


def readme_snippets() -> dict[str, str]:
    return dict(SNIPPET.findall(README.read_text()))


def test_readme_snippets_are_the_example_files():
    snippets = readme_snippets()
    files = {name: text for name, text in snippets.items() if name.startswith("examples/")}
    assert sorted(files) == ["examples/sdk_quickstart/config.yaml", "examples/sdk_quickstart/graph.py"]
    for name, text in files.items():
        assert text == (REPO_ROOT / name).read_text(), f"README's {name} differs from the file"


def parse_commands(block: str) -> tuple[list[str], list[str], list[str]]:
    """The `dynamo serve` argv, the curl argv and the expected output lines (`# ...`)."""
    lines = [line for line in block.splitlines() if line.strip()]
    serve = next(shlex.split(line, comments=True) for line in lines if line.startswith("dynamo serve"))
    curl = next(shlex.split(line, comments=True) for line in lines if line.startswith("curl"))
    expected = [line.removeprefix("# ") for line in lines if line.startswith("# ")]
    return serve, curl, expected


def curl_request(curl: list[str], port: int) -> urllib.request.Request:
    """The request a `curl URL -H header -d body` line sends, to `port`."""
    url = next(arg for arg in curl[1:] if arg.startswith("localhost:"))
    path = url.split("/", 1)[1]
    headers = dict(curl[i + 1].split(": ", 1) for i, arg in enumerate(curl) if arg == "-H")
    body = curl[curl.index("-d") + 1].encode()
    return urllib.request.Request(f"http://127.0.0.1:{port}/{path}", data=body, headers=headers, method="POST")


@pytest.mark.parametrize("backend", ["embedded"], indirect=True)
@pytest.mark.timeout(120)
async def test_readme_sdk_snippet_runs_when_pasted(backend, workers, namespace, tmp_path):
    snippets = readme_snippets()
    (tmp_path / "graph.py").write_text(snippets["examples/sdk_quickstart/graph.py"])
    (tmp_path / "config.yaml").write_text(snippets["examples/sdk_quickstart/config.yaml"])
    serve_argv, curl, expected = parse_commands(snippets["sdk-quickstart-commands"])
    assert serve_argv[:2] == ["dynamo", "serve"] and expected, snippets["sdk-quickstart-commands"]

    port = free_port()  # the README's port may be taken on a test machine
    argv = [sys.executable, "-m", "dynamo.sdk.cli.main", *serve_argv[1:], f"--Frontend.port={port}",
            f"--Frontend.ServiceArgs.dynamo.namespace={namespace}",
            f"--Backend.ServiceArgs.dynamo.namespace={namespace}"]
    serve = workers.command(argv, name="serve", cwd=tmp_path)
    for label in ("Backend[0]", "Backend[1]"):
        await serve.wait_for_line(f"{label} | Backend ready", READY_TIMEOUT)
    await serve.wait_for_line("Frontend[0] | Frontend ready", READY_TIMEOUT)

    def fetch() -> str:
        with urllib.request.urlopen(curl_request(curl, port), timeout=20) as response:
            return response.read().decode()

    body = await asyncio.to_thread(fetch)
    assert body.splitlines() == expected, body
    serve.send_signal(signal.SIGTERM)
    assert await serve.wait_exit(STOP_TIMEOUT) == 0, serve.describe()
