"""The chat page in a real browser (issue 47): headless Chromium, driven by Selenium, against ``lookahead-rag
serve all`` on loopback with keys required, as a person would use it: enter the tenant and key once, upload a
document (progress, then the counts), ask, watch the answer stream in with the documents it used and its
speed line, then a bad key shows the API's one-line error. Screenshots (desktop and phone width) are saved
under ``$LAR_TEST_ARTIFACTS`` (else the test's tmp dir) and their paths printed.

Needs Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them when missing) and selenium
(the dev extra); elsewhere it skips with the command that installs them, unless ``LAR_BROWSER_TESTS=required``
(set by ``.ci/run``), where a missing browser fails instead.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lookahead_core.defaults import DEFAULT_MODEL

from lookahead_rag.services.common.auth.keys import KeyFile
from tests.pipeline.helpers import CALL_TIMEOUT_S, unique_tenant
from tests.pipeline.test_ops_wiring import EXIT_TIMEOUT_S, STARTUP_TIMEOUT_S, free_ports

REPO = Path(__file__).resolve().parents[2]
CHROMIUM, DRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
INSTALL = "apt-get update && apt-get install -y chromium chromium-driver"
REQUIRED = "LAR_BROWSER_TESTS"  # "required": a missing browser fails the test (CI) instead of skipping it
ARTIFACTS = "LAR_TEST_ARTIFACTS"  # where the screenshots go (else the test's tmp dir)
MAX_TOKENS = 12  # SmolLM2 on 2 shared cores: short answers
BAD_KEY = "lar_not-a-real-key"
DOC_NAME = "okapi.md"
DOC = ("# The okapi\n\nThe okapi is a giraffid mammal native to the Congo. It has striped legs like a zebra and "
       "eats leaves with its long blue tongue.\n")
QUESTION = "What colour is the okapi's tongue?"
PHONE = (390, 844)  # CSS pixels of a common phone


def selenium_or_skip() -> Any:
    """The selenium package, once the browser and its driver are here; else a skip naming the install."""
    missing = [str(p) for p in (CHROMIUM, DRIVER) if not p.exists()]
    try:
        import selenium.webdriver as webdriver
    except ImportError:
        webdriver, missing = None, [*missing, "selenium (pip install -e '.[dev]')"]
    if missing:
        why = f"the browser test needs {', '.join(missing)}: {INSTALL}"
        if os.environ.get(REQUIRED) == "required":
            pytest.fail(why)
        pytest.skip(why)
    return webdriver


@dataclass
class Served:
    base: str  # http://127.0.0.1:<port>
    tenant: str
    key: str  # answer + write for ``tenant``


def get(url: str, headers: dict[str, str] | None = None, body: bytes | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=CALL_TIMEOUT_S) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def wait_for(what: str, check: Callable[[], Any], timeout_s: float, poll_s: float = 0.1) -> Any:
    end = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``lookahead-rag serve all`` as an operator runs it, keys required, the HTTP endpoint on a free port."""
    selenium_or_skip()  # before minutes of start-up
    root = tmp_path_factory.mktemp("serve-all")
    keys = KeyFile(root / "keys.json")
    tenant = unique_tenant("browser")
    _, service_key = keys.add(["*"], "services")
    _, key = keys.add([tenant], "page", ["answer", "write"])
    ports = dict(zip(("retriever", "draftcache", "generator", "http"), free_ports(4), strict=True))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAR_")}
    env.update(HF_HUB_OFFLINE="1", LAR_KAFKA_BOOTSTRAP_SERVERS="", LAR_HTTP_PORT=str(ports["http"]),
               LAR_AUTH_MODE="required", LAR_AUTH_KEYS_FILE=str(keys.path), LAR_AUTH_SERVICE_KEY=service_key,
               LAR_GENERATOR_CALIBRATE_KERNELS="false", LAR_GENERATOR_ADAPTIVE_SPECULATION="false",
               LAR_MODEL_NAME=DEFAULT_MODEL)  # the 135M, whatever else is fetched here
    for name in ("retriever", "draftcache", "generator"):
        prefix = f"LAR_{name.upper()}_"
        env.update({prefix + "PORT": str(ports[name]), prefix + "METRICS_PORT": "0",
                    prefix + "DATA_DIR": str(root / name)})
    log_path = root / "serve.log"
    base = f"http://127.0.0.1:{ports['http']}"
    with log_path.open("w") as log_file:
        proc = subprocess.Popen([sys.executable, "-m", "lookahead_rag.services.cli", "serve", "all"], cwd=REPO,
                                env=env, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        def up() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"serve all exited {proc.returncode}: {log_path.read_text()[-4000:]}")
            try:
                return get(f"{base}/health")[0] == 200
            except OSError:
                return False

        wait_for("serve all's /health", up, STARTUP_TIMEOUT_S, poll_s=0.5)
        yield Served(base, tenant, key)
    finally:
        proc.terminate()
        try:
            proc.wait(EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    webdriver = selenium_or_skip()
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1100,900", f"--user-data-dir={tmp_path / 'chromium'}", "--lang=en-US"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(str(DRIVER)))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def artifacts(tmp_path: Path) -> Path:
    folder = Path(os.environ.get(ARTIFACTS) or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def test_a_person_uploads_asks_and_sees_the_streamed_grounded_answer(
        served: Served, browser: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    def find(css: str) -> Any:
        return browser.find_element(By.CSS_SELECTOR, css)

    def js(script: str, *args: Any) -> Any:
        return browser.execute_script(script, *args)

    def text(css: str) -> str:  # shown or not (the connection panel folds once connected)
        return str(find(css).get_attribute("textContent"))

    browser.get(f"{served.base}/")
    assert browser.title == "lookahead-rag"
    # every field has a label, every button a name (keyboard and screen-reader users reach them all)
    unlabelled = js("return [...document.querySelectorAll('input, textarea')].filter(e => !e.labels.length)"
                    ".map(e => e.id).concat([...document.querySelectorAll('button')]"
                    ".filter(b => !b.textContent.trim()).map(b => b.id))")
    assert unlabelled == []

    # the tenant and key, entered once (the panel is open on a first visit), saved with Enter
    assert find("#connection").get_attribute("open") is not None
    find("#tenant").send_keys(served.tenant)
    find("#key").send_keys(served.key)
    find("#max-tokens").clear()
    find("#max-tokens").send_keys(str(MAX_TOKENS), Keys.ENTER)
    status = wait_for("the connection check", lambda: text("#connection-status").startswith("connected") and
                      text("#connection-status"), 60)
    assert "SmolLM2" in status or ":" in status
    assert served.key not in browser.current_url  # kept in the browser, never in a URL
    assert js("return localStorage.getItem('lookahead-rag.key')") == served.key
    wait_for("the panel to fold once connected", lambda: find("#connection").get_attribute("open") is None, 10)

    # a document uploaded: the progress bar fills, then the retriever's counts
    doc_path = tmp_path / DOC_NAME
    doc_path.write_text(DOC)
    find("#files").send_keys(str(doc_path))
    done = wait_for("the upload", lambda: "ok" in (find("#upload-status").get_attribute("class") or "") or
                    "error" in (find("#upload-status").get_attribute("class") or ""), CALL_TIMEOUT_S)
    assert done
    assert "1 of 1 document ingested" in find("#upload-status").text, find("#upload-status").text
    assert float(find("#upload-progress").get_attribute("value")) == 1.0

    # a question asked with Enter; text must appear while the answer is still streaming
    js("""window.streamed = 0;
          new MutationObserver(() => { if (document.querySelector('.answer[aria-busy="true"] .text')?.textContent)
            window.streamed++; }).observe(document.getElementById('conversation'),
            {subtree: true, childList: true, characterData: true});""")
    find("#question").send_keys(QUESTION, Keys.ENTER)
    wait_for("streamed text", lambda: js("return window.streamed") > 0, CALL_TIMEOUT_S, poll_s=0.02)
    answer = wait_for("the answer to end", lambda: (a := find(".answer")).get_attribute("aria-busy") == "false" and a,
                      CALL_TIMEOUT_S)
    error = answer.find_element(By.CSS_SELECTOR, ".error")
    assert not error.is_displayed(), error.text
    assert answer.find_element(By.CSS_SELECTOR, ".text").text.strip()
    sources = answer.find_elements(By.CSS_SELECTOR, ".sources li")
    assert [s.find_element(By.CSS_SELECTOR, "summary span").text for s in sources] == ["The okapi"]
    stats = answer.find_element(By.CSS_SELECTOR, ".stats").text
    assert re.match(r"\d+ tokens · [\d.]+ tokens/s · [\d.]+ tokens/step · first token [\d.]+ s · "
                    r"identical to plain decoding", stats), stats
    # nothing was loaded from anywhere but the product
    assert js("return performance.getEntriesByType('resource').map(r => r.name)"
              ".filter(u => !u.startsWith(location.origin))") == []

    folder = artifacts(tmp_path)
    shots = [folder / "chat-page.png", folder / "chat-page-phone.png"]
    assert browser.save_screenshot(str(shots[0]))
    width, height = PHONE  # a window cannot be that narrow: the page is shown as on a phone
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": width, "height": height, "deviceScaleFactor": 2, "mobile": True})
    assert js("return [window.innerWidth, document.documentElement.scrollWidth]") == [width, width]  # no sideways
    assert browser.save_screenshot(str(shots[1]))
    browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})

    # a bad key: the connection check and the next answer show the API's own one-line message
    chat = {"messages": [{"role": "user", "content": QUESTION}], "stream": True, "max_tokens": MAX_TOKENS}
    code, body = get(f"{served.base}/v1/chat/completions", {"authorization": f"Bearer {BAD_KEY}",
                     "x-tenant": served.tenant, "content-type": "application/json"}, json.dumps(chat).encode())
    assert code == 401
    message = json.loads(body)["error"]["message"]
    if find("#connection").get_attribute("open") is None:
        find("#connection summary").send_keys(Keys.ENTER)
    find("#key").clear()
    find("#key").send_keys(BAD_KEY, Keys.ENTER)
    wait_for("the refused connection check", lambda: text("#connection-status") == message, 60)
    find("#question").send_keys(QUESTION, Keys.ENTER)
    refused = wait_for("the refused answer", lambda: (a := browser.find_elements(By.CSS_SELECTOR, ".answer"))[-1]
                       .get_attribute("aria-busy") == "false" and a[-1], CALL_TIMEOUT_S)
    shown = refused.find_element(By.CSS_SELECTOR, ".error")
    assert shown.is_displayed() and shown.text == message and "\n" not in message
    assert shown.get_attribute("role") == "alert"

    with capsys.disabled():
        for shot in shots:
            assert shot.stat().st_size > 0
            print(f"\nchat page screenshot: {shot}")


def test_citations_are_marked_inline_and_a_bad_upload_is_one_line(served: Served, browser: Any,
                                                                   tmp_path: Path) -> None:
    """Citations (when an answer's final chunk carries them, issue 45) put a marker after the answer's sentence
    that holds the quote, linked to its document, whose cited span is marked; a file the page cannot read is
    refused with one line naming it."""
    from selenium.webdriver.common.by import By

    browser.get(f"{served.base}/")
    answer = "It eats leaves, with its tongue. The okapi lives in the Congo."
    docs = [{"doc_id": "zebra.md", "chunk_id": "zebra.md#0", "title": "Zebras", "source": "", "score": 0.2,
             "text": "Zebras have stripes."},
            {"doc_id": "okapi.md", "chunk_id": "okapi.md#0", "title": "The okapi", "source": "", "score": 0.7,
             "text": "It eats leaves with its long blue tongue."}]
    # the shape the finish chunk carries (services/http/translate.citations): the span in the passage's text, and
    # its quote, found in the answer as the server matched it (case and punctuation between words aside)
    citations = [{"doc_id": "okapi.md", "chunk_id": "okapi.md#0", "start": 0, "end": 14, "quote": "it eats leaves"}]
    marks = browser.execute_script("return citeMarks(arguments[0], arguments[1], arguments[2])", answer, citations,
                                   docs)
    first_sentence = answer.index(".") + 1
    assert marks == [{"at": first_sentence, "n": 1}]  # after the sentence holding it, the second document
    assert browser.execute_script("return citeMarks('x', [{chunk_id: 'gone'}, 7, null], arguments[0])", docs) == []
    browser.execute_script("""const view = addTurn('q');
        renderText(view, arguments[0], citeMarks(arguments[0], arguments[1], arguments[2]));
        renderSources(view, arguments[2], arguments[1]);""", answer, citations, docs)
    link = browser.find_element(By.CSS_SELECTOR, ".answer .cite")
    assert link.text == "[2]" and link.get_attribute("href").endswith("#answer-1-doc-2")
    assert browser.execute_script("return document.querySelector('.answer .text').textContent") == (
        answer[:first_sentence] + "[2]" + answer[first_sentence:])
    assert browser.find_element(By.CSS_SELECTOR, "#answer-1-doc-2 mark").text == "It eats leaves"

    # an answer no passage supports is marked; a retracted one (ungrounded = "abstain") shows the refusal instead
    shown = browser.execute_script("""const view = addTurn('q');
        const kept = verdict(view, {grounded: false}, 'made up');
        const gone = verdict(addTurn('q2'), {grounded: false, retraction: {content: 'The documents do not say.'}},
                             'made up');
        return [kept, view.flag.textContent, view.flag.hidden, gone, verdict(addTurn('q3'), {grounded: true}, 'ok')];
        """)
    assert shown == ["made up", "unsupported", False, "The documents do not say.", "ok"]

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "text": "fine"}\nnot json\n')
    browser.find_element(By.CSS_SELECTOR, "#files").send_keys(str(bad))
    status = wait_for("the refusal", lambda: "error" in (browser.find_element(By.CSS_SELECTOR, "#upload-status")
                                                          .get_attribute("class") or "") and
                      browser.find_element(By.CSS_SELECTOR, "#upload-status").text, 30)
    assert status == "bad.jsonl:2: not JSON"
