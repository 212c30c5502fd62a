"""The console in a real browser (headless Chromium via Selenium), against a
running `agent-runs serve` that crates/cli/tests/console.rs prepared:
a script run awaiting approval whose action holds markup, a defined agent's
run awaiting a tool call, a script run to reject, a defined agent's run
waiting on two calls of one model turn, and one asking a person a question
with an object schema; the agent `guarded` wants a second person to decide.
The browser's key is named "first start". Saves screenshots.

Usage: console_test.py <base url> <key> <read-only key> <script run> <tool run> <reject run> <two-call run> <question run> <screenshot dir>
"""

import json
import sys
import time
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

base, key, reader_key, script_run, tool_run, reject_run, two_calls_run, question_run, shots = sys.argv[1:10]

options = webdriver.ChromeOptions()
options.binary_location = "/usr/bin/chromium"
for flag in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--no-first-run", "--window-size=1280,900"]:
    options.add_argument(flag)
options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
wait = WebDriverWait(driver, 20)


def text_of(selector):
    """The element's text now (read in the page: the console re-renders a run as its events come)."""
    return driver.execute_script(
        "const node = document.querySelector(arguments[0]);"
        " return node ? (node.tagName === 'TEXTAREA' ? node.value : node.innerText) : '';", selector)


def wait_text(selector, expected):
    wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, selector), expected))


def get_run(run_id):
    """The run as the API has it now."""
    request = urllib.request.Request(f"{base}/v1/agent/runs/{run_id}", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request) as response:
        return json.load(response)


def create_run(agent, text):
    """Creates a run with the browser's key, through the API; its id."""
    request = urllib.request.Request(f"{base}/v1/agent/runs", method="POST",
                                     data=json.dumps({"agent": agent, "input": text}).encode(),
                                     headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request) as response:
        return json.load(response)["id"]


def wait_status(run_id, status):
    """Waits until the API has the run in `status`."""
    deadline = time.time() + 20
    while get_run(run_id)["status"] != status:
        assert time.time() < deadline, f"{run_id} is {get_run(run_id)['status']}, not {status}"
        time.sleep(0.2)


def advanced_from(run_id):
    """After a decision in the inbox the next item is shown, not the decided run."""
    wait.until(lambda _: run_id not in text_of("#detail h2") and text_of("#detail h2") != "")


def visible(element_id):
    return driver.find_element(By.ID, element_id).is_displayed()


def sign_in(with_key):
    driver.find_element(By.ID, "key").send_keys(with_key)
    driver.find_element(By.CSS_SELECTOR, "#key-form button[type=submit]").click()


def approval_box(branch):
    """The detail's approval of the call for `branch`."""
    for box in driver.find_elements(By.CSS_SELECTOR, "#detail .approval"):
        shown = box.find_element(By.CSS_SELECTOR, ".arguments")
        if f'"branch": "{branch}"' in (shown.get_attribute("value") or shown.text):
            return box
    raise AssertionError(f"no approval for {branch}: " + text_of("#detail"))


def open_run(run_id):
    """Selects the inbox entry of the run."""
    wait_text("#list", run_id)
    for entry in driver.find_elements(By.CSS_SELECTOR, "#list li"):
        if run_id in entry.text:
            entry.click()
            wait_text("#detail h2", run_id)
            return
    raise AssertionError(f"{run_id} is not in the inbox")


try:
    driver.get(base + "/")  # the root leads a person to the console
    assert driver.current_url.endswith("/console"), driver.current_url
    assert driver.title == "Agent Runs console", driver.title
    # Before a key, nothing but the key form.
    assert not visible("tabs") and not visible("app"), "tabs or lists show before a key is entered"

    # A wrong key shows the API's 401 message, and nothing else.
    sign_in("ark_wrong")
    wait_text("#notice", "A valid API key is required")
    assert not visible("tabs") and not visible("app")

    sign_in(key)
    for run in (script_run, tool_run, reject_run):
        wait_text("#list", run)
    assert not visible("notice"), "the wrong key's error is gone: " + text_of("#notice")
    assert driver.execute_script("return document.cookie") == "", "the key is never a cookie"
    assert key not in driver.current_url

    # Markup in an action is shown as text, never run.
    open_run(script_run)
    action = text_of("#detail .approval .action")
    assert action == "Deploy <script>alert(1)</script><img src=x onerror=alert(1)> v2", action
    assert not driver.find_elements(By.CSS_SELECTOR, "#detail img, #list img, #detail script, #list script"), \
        "markup became elements"
    # One script element, the entry module (the modules it imports are no elements).
    scripts = driver.execute_script("return [...document.scripts].map((script) => script.getAttribute('src'))")
    assert scripts == ["console/console.js"], f"only the console's own script: {scripts}"
    assert "null" not in text_of("#detail"), text_of("#detail")
    exact = driver.find_element(By.CSS_SELECTOR, "#detail time[title]").get_attribute("title")
    assert exact.endswith("Z") and "T" in exact, "relative times keep the exact time on hover: " + exact
    driver.save_screenshot(f"{shots}/console-inbox.png")
    driver.find_element(By.CSS_SELECTOR, "#detail .approval .approve").click()
    wait_text("#notice", "Recorded: approve.")
    # Decide and advance: the next item is shown, the decided one left the list.
    advanced_from(script_run)
    wait_status(script_run, "succeeded")
    wait.until(lambda _: script_run not in text_of("#list"))

    # A tool call: its arguments, a broken edit, a schema error from the API, an edit that works.
    driver.find_element(By.ID, "refresh").click()
    open_run(tool_run)
    wait_text("#events", "approval.requested")
    assert "Deploy" not in text_of("#events"), "another run's events: " + text_of("#events")
    arguments = text_of("#detail .approval .arguments")
    assert '"branch": "old"' in arguments, arguments
    # Who created it: the key's name, the one in use said so.
    wait_text("#detail .meta", "by first start (you)")
    # One view of the arguments, the editor: no second copy to read apart.
    assert len(driver.find_elements(By.CSS_SELECTOR, "#detail .approval .arguments")) == 1
    assert driver.find_element(By.CSS_SELECTOR, "#detail .approval .arguments").tag_name == "textarea"
    assert driver.find_element(By.CSS_SELECTOR, "#detail .approval .approve").text == "Approve"
    # Its veto window: when it approves by itself, and the rejection that vetoes it.
    veto = text_of("#detail .approval .veto")
    assert veto.startswith("auto-approves in ") and "unless someone objects" in veto, veto
    assert driver.find_element(By.CSS_SELECTOR, "#detail .approval .reject").text == "Veto (reject)"
    editor = driver.find_element(By.CSS_SELECTOR, "#detail .approval .editor")
    editor.clear()
    editor.send_keys('{"branch": ')
    wait_text("#detail .approval .invalid", "Not JSON")
    assert driver.find_element(By.CSS_SELECTOR, "#detail .approval .approve").text == "Approve edited"
    # Sent broken, it is refused here, and the buttons stay usable.
    driver.find_element(By.CSS_SELECTOR, "#detail .approval .approve").click()
    assert all(button.is_enabled() for button in driver.find_elements(By.CSS_SELECTOR, "#detail .approval button"))
    editor.clear()
    editor.send_keys('{"branch": 7}')
    driver.find_element(By.CSS_SELECTOR, "#detail .approval .approve").click()
    wait_text("#detail .approval .invalid", "/branch")
    driver.save_screenshot(f"{shots}/console-edit.png")
    editor = driver.find_element(By.CSS_SELECTOR, "#detail .approval .editor")
    editor.clear()
    editor.send_keys('{"branch": "older"}')
    driver.find_element(By.CSS_SELECTOR, "#detail .approval .approve").click()
    wait_text("#notice", "Recorded: edit.")
    advanced_from(tool_run)
    wait_status(tool_run, "succeeded")

    # Keyboard: j/k to the run, a comment, then r rejects.
    driver.find_element(By.ID, "refresh").click()
    wait_text("#list", reject_run)
    body = driver.find_element(By.TAG_NAME, "body")
    for _ in range(6):
        if reject_run in text_of("#detail h2"):
            break
        body.send_keys("j")
        time.sleep(0.3)
    wait_text("#detail h2", reject_run)
    driver.find_element(By.CSS_SELECTOR, "#detail .approval .comment").send_keys("not today")
    body.click()
    time.sleep(1.1)  # a and r are ignored for a second after the view changed
    body.send_keys("r")
    # One key never decides alone: a confirmation shows the call and asks why.
    wait.until(lambda _: visible("confirm"))
    assert "Archive the logs" in text_of("#confirm"), text_of("#confirm")
    reason = driver.find_element(By.CSS_SELECTOR, "#confirm .reason")
    assert reason.get_attribute("value") == "not today"
    assert get_run(reject_run)["pending_approvals"][0]["status"] == "pending", "r alone decided"
    driver.save_screenshot(f"{shots}/console-confirm.png")
    reason.send_keys(Keys.ENTER)
    wait_text("#notice", "Recorded: reject.")
    assert not visible("confirm")
    advanced_from(reject_run)
    wait_status(reject_run, "succeeded")

    # Two calls of one model turn wait at once: picked in the inbox, the
    # second is highlighted, and `a` decides it, never the first.
    driver.find_element(By.ID, "refresh").click()
    wait_text("#list", two_calls_run)
    entries = [entry for entry in driver.find_elements(By.CSS_SELECTOR, "#list li") if two_calls_run in entry.text]
    assert len(entries) == 2, [entry.text for entry in entries]
    next(entry for entry in entries if '"second"' in entry.text).click()
    wait_text("#detail h2", two_calls_run)
    wait.until(lambda _: len(driver.find_elements(By.CSS_SELECTOR, "#detail .approval[data-pending]")) == 2)
    current = driver.find_element(By.CSS_SELECTOR, "#detail .approval.current")
    assert '"second"' in current.text and '"first"' not in current.text, current.text
    # What a person reads is the digest's JSON value, digit for digit.
    shown = approval_box("first").find_element(By.CSS_SELECTOR, ".arguments").text
    for number in ['"tiny": 1.5e-300', '"ratio": 5e-7', '"retries": 2,']:
        assert number in shown + "\n", shown
    # A number no double holds, typed into an edit, is refused by the
    # service as typed, never rounded by the browser first.
    editor = current.find_element(By.CSS_SELECTOR, ".editor")
    editor.clear()
    editor.send_keys('{"branch": "second", "account": 12345678901234567891}')
    current.find_element(By.CSS_SELECTOR, ".approve").click()
    wait_text("#detail .approval.current .invalid", "12345678901234567891")
    statuses = {a["arguments"]["branch"]: a["status"] for a in get_run(two_calls_run)["pending_approvals"]}
    assert statuses == {"first": "pending", "second": "pending"}, statuses
    # The edit undone (back to the proposal): `a` then approves the call as proposed.
    driver.execute_script(
        "arguments[0].value = arguments[0].defaultValue; arguments[0].dispatchEvent(new Event('input'))", editor)
    assert current.find_element(By.CSS_SELECTOR, ".approve").text == "Approve"
    driver.find_element(By.CSS_SELECTOR, "#detail h2").click()  # out of the editor, not into another approval
    time.sleep(1.1)
    # A second `a` while a confirmation is open adds none; after Cancel, a
    # stray Enter decides nothing.
    body.send_keys("a")
    wait.until(lambda _: visible("confirm"))
    body.send_keys("a")
    assert len(driver.find_elements(By.CSS_SELECTOR, "#confirm strong")) == 1
    driver.find_element(By.CSS_SELECTOR, "#confirm button:not(.primary)").click()
    assert not visible("confirm")
    body.send_keys(Keys.ENTER)
    time.sleep(0.5)
    statuses = {a["arguments"]["branch"]: a["status"] for a in get_run(two_calls_run)["pending_approvals"]}
    assert statuses == {"first": "pending", "second": "pending"}, statuses
    # Another call's draft: a change of layout alone is no edit; a real one
    # survives the view being rebuilt when "second" is decided.
    first_box = f'#detail .approval[data-approval="{approval_box("first").get_attribute("data-approval")}"]'
    first_editor = driver.find_element(By.CSS_SELECTOR, first_box + " .editor")
    first_editor.send_keys(Keys.END, Keys.ENTER, "  ")
    assert driver.find_element(By.CSS_SELECTOR, first_box + " .approve").text == "Approve"
    first_editor.send_keys(Keys.CONTROL, "a")
    first_editor.send_keys('{"branch": "first-draft"}')
    assert driver.find_element(By.CSS_SELECTOR, first_box + " .approve").text == "Approve edited"
    current.find_element(By.CSS_SELECTOR, ".action").click()  # "second" picked again
    time.sleep(1.1)
    body.send_keys("a")
    wait.until(lambda _: visible("confirm"))
    assert '"second"' in text_of("#confirm") and '"first"' not in text_of("#confirm"), text_of("#confirm")
    body.send_keys(Keys.ENTER)
    deadline = time.time() + 10
    while statuses["second"] == "pending" and time.time() < deadline:
        time.sleep(0.2)
        statuses = {a["arguments"]["branch"]: a["status"] for a in get_run(two_calls_run)["pending_approvals"]}
    assert statuses == {"first": "pending", "second": "approved"}, statuses
    wait.until(lambda _: len(driver.find_elements(By.CSS_SELECTOR, "#detail .approval[data-pending]")) == 1)
    first_editor = driver.find_element(By.CSS_SELECTOR, first_box + " .editor")
    assert first_editor.get_attribute("value") == '{"branch": "first-draft"}', first_editor.get_attribute("value")
    assert driver.find_element(By.CSS_SELECTOR, first_box + " .approve").text == "Approve edited"
    driver.execute_script(
        "arguments[0].value = arguments[0].defaultValue; arguments[0].dispatchEvent(new Event('input'))", first_editor)
    driver.save_screenshot(f"{shots}/console-two-calls.png")
    # The first, approved as shown: Approve with the editor untouched.
    wait.until(lambda _: len(driver.find_elements(By.CSS_SELECTOR, "#detail .approval[data-pending]")) == 1)
    approval_box("first").find_element(By.CSS_SELECTOR, ".approve").click()
    wait_text("#notice", "Recorded: approve.")
    # The run is done; the only item left, the question, is shown.
    wait_status(two_calls_run, "succeeded")
    wait_text("#detail h2", question_run)

    # A question: a form from its schema; what the form can check is said
    # before sending, and the answer reaches the agent.
    driver.find_element(By.ID, "kind-filter").send_keys("questions")
    wait_text("#list", question_run)
    assert tool_run not in text_of("#list") and two_calls_run not in text_of("#list"), text_of("#list")
    open_run(question_run)
    form = driver.find_element(By.CSS_SELECTOR, "#detail .approval .answer-form")
    assert driver.find_element(By.CSS_SELECTOR, "#detail .approval").text.count("Approve") == 0
    fields = {label.find_element(By.CSS_SELECTOR, "span").text.split(" ")[0]: label
              for label in form.find_elements(By.CSS_SELECTOR, ".answer-field")}
    assert sorted(fields) == ["count", "env", "notes", "priority", "urgent"], sorted(fields)
    # An enum of numbers is a select too; the number chosen is sent as one.
    fields["priority"].find_element(By.CSS_SELECTOR, "select").send_keys("2")
    assert fields["env"].find_elements(By.CSS_SELECTOR, "select"), "an enum is a select"
    assert fields["notes"].find_elements(By.CSS_SELECTOR, "textarea"), "long text is a text area"
    assert fields["urgent"].find_element(By.CSS_SELECTOR, "input").get_attribute("type") == "checkbox"
    count = fields["count"].find_element(By.CSS_SELECTOR, "input")
    assert count.get_attribute("type") == "number"
    count.send_keys("0")
    fields["env"].find_element(By.CSS_SELECTOR, "select").send_keys("prod")
    driver.find_element(By.CSS_SELECTOR, "#detail .approval .answer").click()
    wait_text("#detail .approval .invalid", "count must be at least 1")
    assert get_run(question_run)["pending_approvals"][0]["status"] == "pending", "nothing was sent"
    count.clear()
    count.send_keys("2")
    fields["urgent"].find_element(By.CSS_SELECTOR, "input").click()
    driver.save_screenshot(f"{shots}/console-question.png")
    driver.find_element(By.CSS_SELECTOR, "#detail .approval .answer").click()
    wait_text("#notice", "Answered.")
    wait_text("#detail h2", "succeeded")
    assert '"env": "prod"' in text_of("#detail .approval .answer"), text_of("#detail")
    driver.find_element(By.ID, "kind-filter").send_keys("any")

    # The policy in force, read only.
    rules = {"rules": [{"id": "protect-main", "tool": "delete_branch", "effect": "deny", "reason": "main is protected",
                        "when": [{"path": "/branch", "op": "==", "value": "main"}]}]}
    request = urllib.request.Request(f"{base}/v1/policies", method="PUT", data=json.dumps(rules).encode(),
                                     headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    urllib.request.urlopen(request).close()
    driver.find_element(By.ID, "tab-policy").click()
    wait_text("#list", "protect-main")
    assert "when /branch == \"main\"" in text_of("#list"), text_of("#list")
    assert "reason: main is protected" in text_of("#list"), text_of("#list")
    assert "Policy version 1" in text_of("#list"), text_of("#list")

    # Forget clears every view and stops every stream; no decision is
    # offered for what is no longer shown.
    driver.find_element(By.ID, "forget").click()
    wait_text("#notice", "The key is forgotten.")
    assert not visible("tabs") and not visible("app") and not visible("detail")
    assert not driver.find_elements(By.CSS_SELECTOR, "#detail *, #list li"), "the previous owner's data stays"
    # Signed in again, a run's events show once each.
    sign_in(key)
    driver.find_element(By.ID, "tab-runs").click()
    wait_text("#list", tool_run)
    next(entry for entry in driver.find_elements(By.CSS_SELECTOR, "#list li") if tool_run in entry.text).click()
    wait_text("#events", "run.succeeded")
    # The edit made to its call, as a diff of the proposal and what ran.
    wait_text("#detail .approval .diff", "older")
    removed = [line.text for line in driver.find_elements(By.CSS_SELECTOR, "#detail .diff .removed")]
    added = [line.text for line in driver.find_elements(By.CSS_SELECTOR, "#detail .diff .added")]
    assert removed == ['-   "branch": "old"'] and added == ['+   "branch": "older"'], (removed, added)
    assert "decided by first start (you)" in text_of("#detail .approval"), text_of("#detail .approval")
    driver.execute_script("document.querySelector('#detail .diff').scrollIntoView({block: 'center'})")
    driver.save_screenshot(f"{shots}/console-diff.png")
    time.sleep(0.5)
    created = [line for line in driver.find_elements(By.CSS_SELECTOR, "#events li") if "run.created" in line.text]
    assert len(created) == 1, [line.text for line in driver.find_elements(By.CSS_SELECTOR, "#events li")]
    # An ended run is continued from its page; the new run shows the
    # conversation, both runs in order, itself marked.
    driver.find_element(By.ID, "continue-input").send_keys("Any tags to tidy too?")
    driver.find_element(By.CSS_SELECTOR, "#continue-form button[type=submit]").click()
    wait_text("#notice", "Continued as run_")
    continued = text_of("#notice").split("Continued as ")[1].strip().rstrip(".")
    wait_text("#detail h2", continued)
    wait_text("#detail .meta", "continues " + tool_run)
    wait_status(continued, "succeeded")
    wait_text("#detail", "No tags need tidying.")
    wait_text("#thread", "Conversation")
    thread = [button.get_attribute("data-run") for button in driver.find_elements(By.CSS_SELECTOR, "#thread .thread-run")]
    assert thread == [tool_run, continued], thread
    assert driver.find_element(By.CSS_SELECTOR, "#thread li.current .thread-run").get_attribute("data-run") == continued
    driver.save_screenshot(f"{shots}/console-conversation.png")
    driver.find_element(By.CSS_SELECTOR, f'#thread .thread-run[data-run="{tool_run}"]').click()
    wait_text("#detail h2", tool_run)
    wait_text("#thread", "Conversation")
    # The key that created a run of an agent wanting a second person is told
    # so before anything is sent: no Approve, and `a` says why.
    guarded = create_run("guarded", "Delete the guarded branch")
    wait_status(guarded, "awaiting_approval")
    driver.find_element(By.ID, "refresh").click()
    wait_text("#list", guarded)
    next(entry for entry in driver.find_elements(By.CSS_SELECTOR, "#list li") if guarded in entry.text).click()
    wait_text("#detail h2", guarded)
    wait_text("#detail .approval .second-person", "needs a second person")
    assert not driver.find_elements(By.CSS_SELECTOR, "#detail .approval button"), "a decision the API would refuse"
    driver.save_screenshot(f"{shots}/console-second-person.png")
    driver.find_element(By.CSS_SELECTOR, "#detail .approval .action").click()
    time.sleep(1.1)
    body.send_keys("a")
    wait_text("#notice", "needs a second person")
    assert not visible("confirm")
    # A key that may only read: no inbox, no decisions offered, no 403.
    watched = create_run("script", "approve Watch only")
    wait_status(watched, "awaiting_approval")
    driver.find_element(By.ID, "forget").click()
    sign_in(reader_key)
    wait_text("#list", watched)
    assert not visible("tab-inbox"), "the inbox for a key that may not decide"
    assert "403" not in text_of("#notice") and "approvals:decide" not in text_of("#notice"), text_of("#notice")
    assert driver.find_element(By.ID, "tab-runs").get_attribute("aria-pressed") == "true"
    wait_text("#detail h2", watched)
    wait_text("#detail .approval", "may not decide")
    assert "by first start" in text_of("#detail .meta") and "(you)" not in text_of("#detail .meta"), text_of("#detail")
    assert not driver.find_elements(By.CSS_SELECTOR, "#detail button"), "decisions offered to a key that may not decide"
    driver.find_element(By.ID, "forget").click()
    sign_in(key)

    # The runs tab, and a phone-width window.
    driver.find_element(By.ID, "tab-runs").click()
    wait_text("#list", tool_run)
    driver.set_window_size(390, 844)
    time.sleep(0.3)
    width = driver.execute_script("return document.documentElement.scrollWidth")
    assert width <= 390, f"the page is {width}px wide on a 390px screen"
    # Ids never break mid-id; a tap on a run takes the person to its detail.
    broken = driver.execute_script(
        "return [...document.querySelectorAll('.id')].filter((id) => id.getClientRects().length > 1).length")
    assert broken == 0, f"{broken} ids wrap"
    driver.execute_script("window.scrollTo(0, 0)")
    tapped = driver.find_elements(By.CSS_SELECTOR, "#list li")[1]
    tapped_run = tapped.find_element(By.CSS_SELECTOR, ".id").text
    tapped.click()
    wait_text("#detail h2", tapped_run)
    # Scrolled down to the detail: its top on the screen (at the top, or as
    # far as the page went when it was drawn, for a short run at the end).
    scrolled_to_detail = (
        "const top = document.getElementById('detail').getBoundingClientRect().top;"
        " return window.scrollY > 0 && top > -5 && top < window.innerHeight - 100;")
    wait.until(lambda _: driver.execute_script(scrolled_to_detail))
    width = driver.execute_script("return document.documentElement.scrollWidth")
    assert width <= 390, f"a run's detail is {width}px wide on a 390px screen"
    driver.save_screenshot(f"{shots}/console-phone.png")

    # The wrong key's 401 and the refused edits' 400 were asked for; nothing
    # else may fail (what a key may do is read, never probed with a 403).
    errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"
              and "status of 401" not in entry["message"] and "status of 400" not in entry["message"]]
    assert not errors, errors
    print("console: key, inbox, markup as text, approve, edit with schema error, keyboard reject, "
          "the picked one of two approvals, numbers as the digest has them, the policy, a conversation continued, "
          "names of who created and decided, a second person needed, "
          "phone width: ok")
finally:
    driver.quit()
