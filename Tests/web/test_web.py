"""Journeys through the web view in a real browser (headless chromium), each checked against a
real mount of another device of the same account (docs/web.md)."""

import http.server
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request

from selenium.common.exceptions import NoAlertPresentException
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
    return [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#items td.name bdi")]


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
    assert browser.find_elements(By.TAG_NAME, "script") == []
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
