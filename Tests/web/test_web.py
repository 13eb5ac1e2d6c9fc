"""Journeys through the web view in a real browser (headless chromium), each checked against a
real mount of another device of the same account (docs/web.md)."""

import http.server
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request

from selenium.common.exceptions import NoAlertPresentException, StaleElementReferenceException, WebDriverException
from selenium.webdriver.common.by import By

from conftest import CONTAINER, free_port, wait_for


def screenshot(driver, name):
    """With NIMBUS_WEB_SCREENSHOTS=DIR, saves the page as DIR/NAME.png (docs/web.md's pictures)."""
    folder = os.environ.get("NIMBUS_WEB_SCREENSHOTS")
    if folder:
        os.makedirs(folder, exist_ok=True)
        driver.save_screenshot(os.path.join(folder, name + ".png"))


def sign_in(driver, server, token, name="browser"):
    code = server.pairing_code(token, name)
    driver.get(server.url + "/")
    screenshot(driver, "sign-in")
    driver.find_element(By.ID, "code").send_keys(code)
    driver.find_element(By.ID, "sign-in").click()
    wait_for("the containers page after signing in", lambda: driver.find_elements(By.ID, "containers"))


def names_on_page(driver):
    """The names the folder page shows (read again when the page changes under the reading: a
    form's answer is a redirect to a new page)."""
    for _ in range(100):
        try:
            return [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#items td.name bdi")]
        except StaleElementReferenceException:
            time.sleep(0.05)
    raise AssertionError("the folder page kept changing for 5 s")


def replaced(element):
    """Whether the page that held `element` was replaced (the element is gone with it)."""
    try:
        element.is_enabled()
        return False
    except StaleElementReferenceException:
        return True
    except WebDriverException as e:
        if "does not belong to the document" in str(e):
            return True
        raise


def open_container(driver):
    driver.find_element(By.LINK_TEXT, CONTAINER).click()
    wait_for("the container's folder page", lambda: driver.find_elements(By.ID, "items"))


def cookie_header(driver):
    return "nimbus_web=" + driver.get_cookie("nimbus_web")["value"]


def post(url, fields, headers):
    body = "&".join(f"{k}={urllib.request.quote(v)}" for k, v in fields.items()).encode()
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": "application/x-www-form-urlencoded", **headers})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_sign_in_browse_and_download_bytes_equal(world, browser):
    server, token, mount = world
    os.makedirs(os.path.join(mount.path, "Projects", "2026"))
    data = os.urandom(9_000_000) + b"end"  # several chunks
    with open(os.path.join(mount.path, "Projects", "2026", "report.bin"), "wb") as f:
        f.write(data)
    with open(os.path.join(mount.path, "top.txt"), "w") as f:
        f.write("hello\n")
    mount.settled()

    sign_in(browser, server, token)
    # The session is a device of the account.
    assert "browser" in server.devices()
    screenshot(browser, "containers")
    open_container(browser)
    assert names_on_page(browser) == ["Projects", "top.txt"]
    browser.find_element(By.LINK_TEXT, "Projects/").click()
    wait_for("Projects' page", lambda: names_on_page(browser) == ["2026"])
    browser.find_element(By.LINK_TEXT, "2026/").click()
    wait_for("2026's page", lambda: names_on_page(browser) == ["report.bin"])
    screenshot(browser, "folder")
    crumbs = browser.find_element(By.ID, "crumbs").text
    assert "Projects" in crumbs and "2026" in crumbs
    browser.find_element(By.LINK_TEXT, "report.bin").click()
    path = os.path.join(browser.downloads, "report.bin")
    wait_for("the download in the browser's folder", lambda: os.path.exists(path) and os.path.getsize(path) == len(data), timeout=30)
    with open(path, "rb") as f:
        assert f.read() == data
    # The breadcrumbs lead back.
    browser.find_element(By.LINK_TEXT, "Projects").click()
    wait_for("Projects' page again", lambda: names_on_page(browser) == ["2026"])

    # A byte range, as a resumed download asks for it; the answer is an attachment, never a page.
    href = None
    browser.find_element(By.LINK_TEXT, "2026/").click()
    wait_for("2026's page again", lambda: browser.find_elements(By.LINK_TEXT, "report.bin"))
    href = browser.find_element(By.LINK_TEXT, "report.bin").get_attribute("href")
    req = urllib.request.Request(href, headers={"Cookie": cookie_header(browser), "Range": "bytes=4194000-4194999"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 206
        assert r.headers["Content-Range"] == f"bytes 4194000-4194999/{len(data)}"
        assert r.headers["Content-Disposition"].startswith("attachment;")
        assert r.headers["X-Content-Type-Options"] == "nosniff"
        assert r.read() == data[4194000:4195000]


def test_hostile_names_render_as_text(world, browser):
    server, token, mount = world
    names = ["<script>alert(1)<\\script>", "\"onerror=alert(2) x.png", "\u202etxt.exe", "new\nline", "a&amp;b", "<img src=x onerror=alert(3)>"]
    for n in names:
        with open(os.path.join(mount.path, n), "w") as f:
            f.write(n)
    mount.settled()
    sign_in(browser, server, token)
    open_container(browser)
    shown = names_on_page(browser)
    screenshot(browser, "hostile-names")
    # Control characters are shown as their pictures (U+240A for a newline), everything else as it is.
    expected = sorted(n.replace("\n", "\u240a") for n in names)
    assert sorted(shown) == expected, shown
    try:
        browser.switch_to.alert
        raise AssertionError("a file name ran as script")
    except NoAlertPresentException:
        pass
    # The page's one script is the server's own file; no name became a script element.
    scripts = [e.get_attribute("src") for e in browser.find_elements(By.TAG_NAME, "script")]
    assert len(scripts) == 1 and scripts[0].startswith(server.url + "/web/app.js?v="), scripts
    assert browser.find_elements(By.TAG_NAME, "img") == []
    # Each name downloads as itself.
    for link in browser.find_elements(By.CSS_SELECTOR, "#items a.file"):
        req = urllib.request.Request(link.get_attribute("href"), headers={"Cookie": cookie_header(browser)})
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read().decode()
            assert body in names
            assert r.headers["Content-Type"] == "application/octet-stream"


def test_a_cross_site_post_is_refused(world, browser):
    server, token, mount = world
    sign_in(browser, server, token)
    csrf = browser.find_element(By.NAME, "csrf").get_attribute("value")
    cookie = cookie_header(browser)
    # Another site posting with the session's cookie (as an older browser would send it): refused.
    status, body = post(server.url + "/web/sign-out", {"csrf": csrf}, {"Cookie": cookie, "Origin": "http://evil.example"})
    assert status == 403 and "another site" in body
    status, _ = post(server.url + "/web/sign-out", {"csrf": csrf}, {"Cookie": cookie, "Sec-Fetch-Site": "cross-site"})
    assert status == 403
    # This origin without the form's CSRF value: refused.
    status, body = post(server.url + "/web/sign-out", {"csrf": "0" * 32}, {"Cookie": cookie})
    assert status == 403 and "out of date" in body

    # A real page of another site whose form posts to the sign-out in the same browser.
    evil_port = free_port()
    page = f"""<!doctype html><form id=f method=post action="{server.url}/web/sign-out">
        <input type=hidden name=csrf value="{csrf}"></form><script>document.getElementById('f').submit()</script>"""

    class Evil(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(page.encode())

        def log_message(self, *args):
            pass

    evil = http.server.ThreadingHTTPServer(("127.0.0.1", evil_port), Evil)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    try:
        # localhost is another site than 127.0.0.1 for the browser.
        browser.get(f"http://localhost:{evil_port}/")
        wait_for("the server's answer to the other site's form", lambda: browser.current_url.startswith(server.url))
        assert "Refused" in browser.find_element(By.TAG_NAME, "h1").text
    finally:
        evil.shutdown()
    # Still signed in, and the device is not revoked.
    browser.get(server.url + "/")
    assert browser.find_elements(By.ID, "containers")
    assert "revoked" not in [line for line in server.devices().splitlines() if "browser" in line][0]


def test_sign_out_ends_the_session_everywhere(world, browser):
    server, token, mount = world
    sign_in(browser, server, token)
    cookie = cookie_header(browser)
    browser.find_element(By.LINK_TEXT, "Devices").click()
    wait_for("the devices page", lambda: browser.find_elements(By.ID, "devices"))
    rows = browser.find_element(By.ID, "devices").text
    assert "laptop" in rows and "browser" in rows and "(this browser)" in rows
    screenshot(browser, "devices")
    browser.find_element(By.ID, "sign-out").click()
    wait_for("the sign-in page after signing out", lambda: browser.find_elements(By.ID, "code"))
    # The old cookie is worth nothing now, and the device is revoked.
    req = urllib.request.Request(server.url + "/web/c/" + CONTAINER, headers={"Cookie": cookie})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert "Sign in" in r.read().decode()  # redirected to the sign-in page
    line = [line for line in server.devices().splitlines() if "browser" in line][0]
    assert "revoked" in line, line
    # A wrong code says so and signs nobody in.
    browser.find_element(By.ID, "code").send_keys("AAAA-AAAA-AAAA")
    browser.find_element(By.ID, "sign-in").click()
    wait_for("the wrong code's message", lambda: browser.find_elements(By.ID, "message"))
    assert "unknown, already used or expired" in browser.find_element(By.ID, "message").text


def row_of(driver, name):
    return driver.find_element(By.XPATH, f"//table[@id='items']//tr[.//bdi[text()='{name}']]")


def test_new_folder_rename_and_delete_are_seen_on_the_mount(world, browser):
    server, token, mount = world
    draft, final, old = (os.path.join(mount.path, n) for n in ("draft.txt", "final.txt", "old.txt"))
    with open(draft, "w") as f:
        f.write("draft\n")
    with open(old, "w") as f:
        f.write("old\n")
    mount.settled()
    sign_in(browser, server, token)
    open_container(browser)

    browser.find_element(By.ID, "new-folder-name").send_keys("Made on the web")
    browser.find_element(By.ID, "new-folder").click()
    wait_for("the new folder on the page", lambda: "Made on the web" in names_on_page(browser))
    made = os.path.join(mount.path, "Made on the web")
    wait_for("the new folder in ls on the mount", lambda: "Made on the web" in os.listdir(mount.path), timeout=2)
    assert os.path.isdir(made)

    field = row_of(browser, "draft.txt").find_element(By.CSS_SELECTOR, "input[name=name]")
    field.clear()
    field.send_keys("final.txt")
    row_of(browser, "draft.txt").find_element(By.CSS_SELECTOR, "button.rename").click()
    wait_for("the rename on the page", lambda: "final.txt" in names_on_page(browser))
    wait_for("the rename on the mount", lambda: os.path.exists(final) and not os.path.exists(draft), timeout=2)
    with open(final) as f:
        assert f.read() == "draft\n"

    row_of(browser, "old.txt").find_element(By.CSS_SELECTOR, "button.delete").click()
    wait_for("the delete on the page", lambda: "old.txt" not in names_on_page(browser))
    wait_for("the delete on the mount", lambda: not os.path.exists(old), timeout=2)

    # A page made before the laptop edited the file: its delete is ignored, the edit stays. (The
    # page refreshes itself when the container changes, so the form gets back the version and
    # cursor it had before the edit: a page whose refresh had not come yet, or with script off.)
    form = "form[action$='/delete']"
    seen = {k: row_of(browser, "final.txt").find_element(By.CSS_SELECTOR, f"{form} input[name={k}]").get_attribute("value")
            for k in ("version", "cursor")}
    with open(final, "w") as f:
        f.write("edited on the laptop\n")
    wait_for("the laptop's edit on the server", lambda: any(
        i["name"] == "final.txt" and i["size"] == 21 for i in server.api(token, "GET", f"/v1/containers/{CONTAINER}/items")["items"]))
    def size_shown():
        try:
            return row_of(browser, "final.txt").find_element(By.CSS_SELECTOR, "td.num").text == "21 B"
        except StaleElementReferenceException:
            return False
    wait_for("the page refreshed with the edit", size_shown)
    for k, v in seen.items():
        for _ in range(100):
            try:
                field = row_of(browser, "final.txt").find_element(By.CSS_SELECTOR, f"{form} input[name={k}]")
                browser.execute_script("arguments[0].value = arguments[1]", field, v)
                break
            except StaleElementReferenceException:
                time.sleep(0.05)
    listing = browser.find_element(By.ID, "items")
    row_of(browser, "final.txt").find_element(By.CSS_SELECTOR, "button.delete").click()
    # The form's answer is a new page: wait until it replaced this one and is whole (the
    # listing of this page is still there right after the click).
    wait_for("the folder page after the delete", lambda: replaced(listing)
             and browser.execute_script("return document.readyState") == "complete"
             and browser.find_elements(By.ID, "items"))
    assert "final.txt" in names_on_page(browser), "a delete on an older version than the edit is ignored"
    time.sleep(0.5)
    with open(final) as f:
        assert f.read() == "edited on the laptop\n"

    # A name the server refuses says why and changes nothing.
    field = row_of(browser, "final.txt").find_element(By.CSS_SELECTOR, "input[name=name]")
    field.clear()
    field.send_keys("a/b")
    row_of(browser, "final.txt").find_element(By.CSS_SELECTOR, "button.rename").click()
    wait_for("the refusal", lambda: browser.find_elements(By.CSS_SELECTOR, "p.error"))
    assert "cannot contain \"/\"" in browser.find_element(By.CSS_SELECTOR, "p.error").text
    assert os.path.exists(final)


def test_a_folder_of_10000_items_shows_its_first_page_at_once(world, browser):
    server, token, mount = world
    big = "00000000-0000-4000-8000-00000000b16f"
    server.api(token, "POST", f"/v1/containers/{CONTAINER}/commit",
               {"item": big, "state": {"kind": "folder", "parent": "00000000-0000-0000-0000-000000000000", "name": "big",
                                       "chunks": [], "mode": 493, "modified": 1_700_000_000_000_000_000, "deleted": False}})
    names = [f"item {i:05d}" for i in range(10_000)]
    for start in range(0, len(names), 64):
        commits = [{"item": f"00000000-0000-4000-9000-{start + i:012x}",
                    "state": {"kind": "folder", "parent": big, "name": n, "chunks": [], "mode": 493,
                              "modified": 1_700_000_000_000_000_000, "deleted": False}}
                   for i, n in enumerate(names[start:start + 64])]
        server.api(token, "POST", f"/v1/containers/{CONTAINER}/commits", {"commits": commits})
    # The laptop's mount takes them in first (its pull of 10,000 items would share the 2 cores
    # with the page being timed).
    wait_for("the 10,000 items on the mount", lambda: len(os.listdir(os.path.join(mount.path, "big"))) == 10_000, timeout=60)
    sign_in(browser, server, token)
    began = time.monotonic()
    browser.get(f"{server.url}/web/c/{CONTAINER}?folder={big}")  # returns once the page has loaded
    browser.find_element(By.ID, "items")
    took = time.monotonic() - began
    assert names_on_page(browser) == names[:200]
    assert took < 1.0, f"the first page of 10,000 items took {took:.3f} s"
    print(f"first page of a folder of 10,000 items: {took * 1000:.0f} ms")
    browser.find_element(By.ID, "next").click()
    wait_for("the second page", lambda: names_on_page(browser)[:1] == [names[200]])
    assert names_on_page(browser) == names[200:400]
