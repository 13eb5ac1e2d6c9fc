"""Journeys that change the container from the web view (upload, move, versions, conflicts,
Recently Deleted) or the account (devices, pairing, idle sessions), each checked against real
mounts of other devices of the same account (docs/web.md)."""

import os
import subprocess
import tempfile
import time

import pytest
from selenium.common.exceptions import NoSuchElementException
from selenium.webdriver.common.by import By

from conftest import BIN, CONTAINER, Mount, wait_for
from test_web import names_on_page, open_container, row_of, screenshot, sign_in


def read(path):
    with open(path, "rb") as f:
        return f.read()


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def status_line(mount, key):
    for line in mount.status().splitlines():
        if line.startswith(key + ": "):
            return line[len(key) + 2:]
    return None


def uploaded(browser, rows):
    """The upload panel has `rows` rows and says its last upload ended."""
    panel = browser.find_element(By.ID, "upload")
    return (len(browser.find_elements(By.CSS_SELECTOR, "#uploads li")) == rows and panel.get_attribute("data-state") == "done"
            and all(e.text.startswith("done") for e in browser.find_elements(By.CSS_SELECTOR, "#uploads .state")))


def test_upload_files_and_a_folder_with_progress_seen_on_the_mount(world, browser):
    server, token, mount = world
    src = tempfile.mkdtemp(prefix="nimbus-web-upload-")
    try:
        big = os.urandom(12_000_000)  # several chunks, cut by the server as a device cuts them
        write(os.path.join(src, "big.bin"), big)
        write(os.path.join(src, "note <b>.txt"), b"hello from the browser\n")
        os.makedirs(os.path.join(src, "album", "2026"))
        write(os.path.join(src, "album", "cover.jpg"), b"\xff\xd8 not really a jpeg")
        write(os.path.join(src, "album", "2026", "a.raw"), os.urandom(300_000))

        sign_in(browser, server, token)
        open_container(browser)
        wait_for("the upload panel shown by the script", lambda: browser.find_element(By.ID, "upload").is_displayed())
        browser.find_element(By.ID, "upload-files").send_keys(
            os.path.join(src, "big.bin") + "\n" + os.path.join(src, "note <b>.txt"))
        wait_for("the two files uploaded", lambda: uploaded(browser, 2), timeout=60)
        done = time.monotonic()
        total = browser.find_element(By.ID, "upload-progress")
        assert total.get_attribute("value") == total.get_attribute("max") == str(len(big) + 23)
        states = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#uploads .state")]
        assert states == ["done", "done"], states
        screenshot(browser, "upload")
        wait_for("the uploads in ls on the mount", lambda: {"big.bin", "note <b>.txt"} <= set(os.listdir(mount.path)), timeout=10)
        print(f"web figures: uploaded files in ls on the mount {time.monotonic() - done:.2f} s after the upload ended")
        assert time.monotonic() - done < 2.0
        assert read(os.path.join(mount.path, "big.bin")) == big
        assert read(os.path.join(mount.path, "note <b>.txt")) == b"hello from the browser\n"
        # The page showed them without being reloaded by anyone (live refresh).
        wait_for("the page's list with the uploads", lambda: {"big.bin", "note <b>.txt"} <= set(names_on_page(browser)))

        # A folder with a folder inside: the same tree on the mount.
        browser.find_element(By.ID, "upload-folder").send_keys(os.path.join(src, "album"))
        wait_for("the folder uploaded", lambda: uploaded(browser, 4), timeout=60)
        wait_for("the folder's files on the mount", lambda: os.path.exists(os.path.join(mount.path, "album", "2026", "a.raw"))
                 and os.path.exists(os.path.join(mount.path, "album", "cover.jpg")), timeout=10)
        assert read(os.path.join(mount.path, "album", "cover.jpg")) == b"\xff\xd8 not really a jpeg"
        assert read(os.path.join(mount.path, "album", "2026", "a.raw")) == read(os.path.join(src, "album", "2026", "a.raw"))

        # The same name again: kept beside, as for any device; the row says so.
        browser.find_element(By.ID, "upload-files").send_keys(os.path.join(src, "note <b>.txt"))
        wait_for("the third upload", lambda: uploaded(browser, 5), timeout=30)
        last = browser.find_elements(By.CSS_SELECTOR, "#uploads .state")[-1].text
        assert last.startswith("done, as note <b> 2.txt"), last
        wait_for("the renamed upload on the mount", lambda: os.path.exists(os.path.join(mount.path, "note <b> 2.txt")))
        assert read(os.path.join(mount.path, "note <b>.txt")) == b"hello from the browser\n"
    finally:
        subprocess.run(["rm", "-rf", src])


def test_an_upload_without_the_pages_csrf_header_or_from_another_site_is_refused(world, browser):
    server, token, mount = world
    sign_in(browser, server, token)
    cookie = "nimbus_web=" + browser.get_cookie("nimbus_web")["value"]
    import urllib.error
    import urllib.request

    def upload(headers):
        req = urllib.request.Request(server.url + f"/web/c/{CONTAINER}/upload?name=x.txt", data=b"evil", method="POST",
                                     headers={"Cookie": cookie, "Content-Type": "application/octet-stream", **headers})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    assert upload({}) == 403
    assert upload({"X-Nimbus-CSRF": "0" * 32}) == 403
    csrf = browser.find_element(By.CSS_SELECTOR, "input[name=csrf]").get_attribute("value")
    assert upload({"X-Nimbus-CSRF": csrf, "Origin": "http://evil.example"}) == 403
    assert upload({"X-Nimbus-CSRF": csrf, "Sec-Fetch-Site": "cross-site"}) == 403
    time.sleep(1)
    assert "x.txt" not in os.listdir(mount.path)
    # The page's own header, from this origin: taken.
    assert upload({"X-Nimbus-CSRF": csrf, "Origin": server.url}) == 200
    wait_for("the upload on the mount", lambda: "x.txt" in os.listdir(mount.path))


def test_move_into_another_folder_is_seen_on_the_mount(world, browser):
    server, token, mount = world
    os.makedirs(os.path.join(mount.path, "Inbox"))
    os.makedirs(os.path.join(mount.path, "Archive", "2026"))
    write(os.path.join(mount.path, "Inbox", "letter.txt"), b"dear web\n")
    mount.settled()
    sign_in(browser, server, token)
    open_container(browser)
    browser.find_element(By.LINK_TEXT, "Inbox/").click()
    wait_for("Inbox's page", lambda: "letter.txt" in names_on_page(browser))
    row_of(browser, "letter.txt").find_element(By.CSS_SELECTOR, "a.move").click()
    wait_for("the move page", lambda: browser.find_elements(By.ID, "move-here"))
    # Up to the container, down into Archive/2026.
    browser.find_element(By.CSS_SELECTOR, "#crumbs a:nth-of-type(2)").click()
    wait_for("the container's folders", lambda: browser.find_elements(By.LINK_TEXT, "Archive/"))
    browser.find_element(By.LINK_TEXT, "Archive/").click()
    wait_for("Archive's folders", lambda: browser.find_elements(By.LINK_TEXT, "2026/"))
    browser.find_element(By.LINK_TEXT, "2026/").click()
    wait_for("2026 chosen", lambda: "2026" in browser.find_element(By.ID, "crumbs").text)
    screenshot(browser, "move")
    browser.find_element(By.ID, "move-here").click()
    moved = time.monotonic()
    wait_for("the move on the mount", lambda: os.path.exists(os.path.join(mount.path, "Archive", "2026", "letter.txt")), timeout=10)
    assert time.monotonic() - moved < 2.0
    assert not os.path.exists(os.path.join(mount.path, "Inbox", "letter.txt"))
    assert read(os.path.join(mount.path, "Archive", "2026", "letter.txt")) == b"dear web\n"
    # A folder cannot go inside itself: the server refuses, with the reason.
    open_container(browser)
    row_of(browser, "Archive").find_element(By.CSS_SELECTOR, "a.move").click()
    wait_for("the move page", lambda: browser.find_elements(By.ID, "move-here"))
    assert not browser.find_elements(By.LINK_TEXT, "Archive/"), "the item itself is not offered as its destination"


def test_restore_an_earlier_version_from_the_files_page(world, browser):
    server, token, mount = world
    path = os.path.join(mount.path, "plan.txt")
    write(path, b"first plan\n")
    mount.settled()
    write(path, b"second plan, worse\n")
    mount.settled()
    sign_in(browser, server, token)
    open_container(browser)
    row_of(browser, "plan.txt").find_element(By.CSS_SELECTOR, "a.versions").click()
    wait_for("the file's versions", lambda: len(browser.find_elements(By.CSS_SELECTOR, "#versions tbody tr")) >= 2)
    roles = [r.get_attribute("data-role") for r in browser.find_elements(By.CSS_SELECTOR, "#versions tbody tr")]
    assert roles[0] == "current" and "previous" in roles, roles
    screenshot(browser, "versions")
    earlier = browser.find_element(By.CSS_SELECTOR, "#versions tr[data-role=previous]")
    # The earlier version downloads as its own bytes.
    earlier.find_element(By.CSS_SELECTOR, "a.download").click()
    target = os.path.join(browser.downloads, "plan.txt")
    wait_for("the earlier version downloaded", lambda: os.path.exists(target) and read(target) == b"first plan\n")
    earlier.find_element(By.CSS_SELECTOR, "button.restore").click()
    restored = time.monotonic()
    wait_for("the restored version on the mount", lambda: read(path) == b"first plan\n", timeout=10)
    assert time.monotonic() - restored < 2.0
    # The version it replaced is kept as an earlier one.
    wait_for("the page after the restore", lambda: len(browser.find_elements(By.CSS_SELECTOR, "#versions tr[data-role=previous]")) >= 2)


def test_resolve_a_conflict_made_by_two_mounts(world, desktop, browser):
    server, token, laptop = world
    write(os.path.join(laptop.path, "doc.txt"), b"v1")
    wait_for("v1 on the desktop", lambda: os.path.exists(os.path.join(desktop.path, "doc.txt"))
             and read(os.path.join(desktop.path, "doc.txt")) == b"v1", timeout=15)
    subprocess.run([BIN, "pause", laptop.path], check=True, capture_output=True)
    subprocess.run([BIN, "pause", desktop.path], check=True, capture_output=True)
    write(os.path.join(laptop.path, "doc.txt"), b"edit on the laptop")
    time.sleep(1.1)  # the desktop's edit is the later one: it becomes current
    write(os.path.join(desktop.path, "doc.txt"), b"edit on the desktop, later")
    subprocess.run([BIN, "resume", laptop.path], check=True, capture_output=True)
    subprocess.run([BIN, "resume", desktop.path], check=True, capture_output=True)
    wait_for("the conflict on the laptop", lambda: status_line(laptop, "conflicts") == "1", timeout=30)

    sign_in(browser, server, token)
    open_container(browser)
    wait_for("the conflict shown in the folder", lambda: row_of(browser, "doc.txt").find_elements(By.CSS_SELECTOR, "a.conflict"))
    row_of(browser, "doc.txt").find_element(By.CSS_SELECTOR, "a.conflict").click()
    wait_for("the conflict on the file's page", lambda: browser.find_elements(By.ID, "conflict-note"))
    screenshot(browser, "conflict")
    conflict = browser.find_element(By.CSS_SELECTOR, "#versions tr[data-role=conflict]")
    assert "laptop" in conflict.text
    conflict.find_element(By.CSS_SELECTOR, "button.keep_version").click()
    resolved = time.monotonic()
    for m in (laptop, desktop):
        wait_for(f"the kept version on {m.path}", lambda: read(os.path.join(m.path, "doc.txt")) == b"edit on the laptop", timeout=10)
        wait_for(f"no conflict left on {m.path}", lambda: status_line(m, "conflicts") == "0", timeout=10)
    print(f"web figures: a conflict resolved on the web reached both mounts in {time.monotonic() - resolved:.2f} s")
    assert not browser.find_elements(By.ID, "conflict-note")


def test_restore_and_purge_from_recently_deleted(world, browser):
    server, token, mount = world
    os.makedirs(os.path.join(mount.path, "old", "deep"))
    write(os.path.join(mount.path, "old", "deep", "keep.txt"), b"keep me\n")
    write(os.path.join(mount.path, "junk.txt"), b"junk\n")
    mount.settled()
    subprocess.run(["rm", "-r", os.path.join(mount.path, "old"), os.path.join(mount.path, "junk.txt")], check=True)
    mount.settled()
    sign_in(browser, server, token)
    open_container(browser)
    browser.find_element(By.ID, "trash-link").click()
    wait_for("two entries in Recently Deleted", lambda: len(browser.find_elements(By.CSS_SELECTOR, "#trash tbody tr")) == 2)
    screenshot(browser, "trash")
    rows = {r.find_element(By.CSS_SELECTOR, "td.name bdi").text: r for r in browser.find_elements(By.CSS_SELECTOR, "#trash tbody tr")}
    assert set(rows) == {"old", "junk.txt"}, list(rows)
    assert "laptop" in rows["old"].text and "(3 items)" in rows["old"].text
    rows["old"].find_element(By.CSS_SELECTOR, "button.restore").click()
    restored = time.monotonic()
    wait_for("the folder back on the mount", lambda: os.path.exists(os.path.join(mount.path, "old", "deep", "keep.txt")), timeout=10)
    assert time.monotonic() - restored < 2.0
    assert read(os.path.join(mount.path, "old", "deep", "keep.txt")) == b"keep me\n"
    browser.find_element(By.ID, "trash-link").click()
    wait_for("one entry left", lambda: len(browser.find_elements(By.CSS_SELECTOR, "#trash tbody tr")) == 1)
    browser.find_element(By.CSS_SELECTOR, "#trash button.purge").click()
    wait_for("Recently Deleted empty", lambda: browser.find_elements(By.ID, "empty"))
    wait_for("the mount's count of Recently Deleted", lambda: status_line(mount, "recently-deleted") == "0", timeout=30)
    assert not os.path.exists(os.path.join(mount.path, "junk.txt"))


def device_row(browser, name):
    """The row of the devices table for `name`; NoSuchElementException while the page has none (wait_for reads again)."""
    for r in browser.find_elements(By.CSS_SELECTOR, "#devices tbody tr"):
        if r.find_element(By.CSS_SELECTOR, "td.name").text == name:
            return r
    raise NoSuchElementException(f"no row for the device {name} on the devices page")


def test_revoke_a_device_its_mount_shows_unauthorized_and_keeps_its_edits(world, browser):
    server, token, mount = world
    write(os.path.join(mount.path, "synced.txt"), b"synced before\n")
    mount.settled()
    sign_in(browser, server, token)
    browser.find_element(By.LINK_TEXT, "Devices").click()
    wait_for("the devices page", lambda: browser.find_elements(By.ID, "devices"))
    wait_for("laptop's revoke button", lambda: device_row(browser, "laptop").find_element(By.CSS_SELECTOR, "button")).click()
    wait_for("laptop revoked on the page", lambda: "revoked" in device_row(browser, "laptop").text)
    # An edit made after the revocation stays on the mount, queued; nothing is lost.
    write(os.path.join(mount.path, "after.txt"), b"written after the revocation\n")
    wait_for("the mount saying unauthorized", lambda: (status_line(mount, "connection") or "").startswith("unauthorized"), timeout=30)
    assert read(os.path.join(mount.path, "after.txt")) == b"written after the revocation\n"
    assert read(os.path.join(mount.path, "synced.txt")) == b"synced before\n"
    assert int(status_line(mount, "upload-queue") or "0") >= 1
    # The browser's own session goes on.
    browser.find_element(By.LINK_TEXT, "Devices").click()
    wait_for("the devices page again", lambda: browser.find_elements(By.ID, "devices"))


def test_a_pairing_code_made_on_the_web_enrolls_a_device(world, browser):
    server, token, mount = world
    write(os.path.join(mount.path, "shared.txt"), b"for the tablet\n")
    mount.settled()
    sign_in(browser, server, token)
    browser.find_element(By.LINK_TEXT, "Devices").click()
    wait_for("the devices page", lambda: browser.find_elements(By.ID, "make-pairing"))
    browser.find_element(By.ID, "pairing-new-name").send_keys("tablet")
    browser.find_element(By.ID, "make-pairing").click()
    wait_for("the code", lambda: browser.find_elements(By.ID, "pairing-code"))
    screenshot(browser, "pairing")
    code = browser.find_element(By.ID, "pairing-code").text
    assert server.url in browser.find_element(By.ID, "pairing-command").text
    state = os.path.join(server.root, "state-tablet")
    subprocess.run([BIN, "login", server.url, "--code", code, "--state", state], check=True, capture_output=True, timeout=30)
    assert "tablet" in server.devices()
    tablet = os.path.join(server.root, "mnt-tablet")
    os.makedirs(tablet)
    try:
        subprocess.run([BIN, "mount", tablet, "--state", state, "--container", CONTAINER], check=True, capture_output=True, timeout=60)
        wait_for("the laptop's file on the tablet", lambda: os.path.exists(os.path.join(tablet, "shared.txt"))
                 and read(os.path.join(tablet, "shared.txt")) == b"for the tablet\n", timeout=15)
    finally:
        r = subprocess.run([BIN, "unmount", tablet], capture_output=True, timeout=60)
        if r.returncode != 0:
            subprocess.run(["fusermount3", "-u", "-z", tablet], capture_output=True)
    # The code worked once.
    r = subprocess.run([BIN, "login", server.url, "--code", code, "--state", state + "-again"], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "unknown, already used or expired" in r.stderr, r.stderr


@pytest.mark.parametrize("server_args", [("--web-idle", "3")])
def test_an_idle_session_expires(world, browser):
    server, token, mount = world
    sign_in(browser, server, token, name="idle browser")
    browser.find_element(By.LINK_TEXT, "Devices").click()
    wait_for("the devices page", lambda: browser.find_elements(By.ID, "devices"))
    assert "web, idle expiry" in browser.find_element(By.ID, "devices").text
    # Used within the idle time: still signed in.
    for _ in range(3):
        time.sleep(1.5)
        browser.get(server.url + "/web/devices")
        assert browser.find_elements(By.ID, "devices")
    time.sleep(4)
    browser.get(server.url + "/web/devices")
    wait_for("the sign-in page after the idle time", lambda: browser.find_elements(By.ID, "code"))
    assert "idle" in browser.find_element(By.ID, "message").text
    listed = [line for line in server.devices().splitlines() if "idle browser" in line]
    assert listed and "revoked" in listed[0], server.devices()

    # A page left open follows changes by itself (live refresh): that is no use of the session,
    # so it is signed out all the same, and the page says so by itself.
    sign_in(browser, server, token, name="tab left open")
    open_container(browser)
    wait_for("the page following changes", lambda: browser.find_element(By.TAG_NAME, "main").get_attribute("data-live") == "on")
    for i in range(6):
        write(os.path.join(mount.path, f"change {i}.txt"), b"x")
        time.sleep(1)
        if browser.find_elements(By.ID, "code"):
            break
    wait_for("the open page turned into the sign-in page", lambda: browser.find_elements(By.ID, "code"), timeout=10)
    assert "idle" in browser.find_element(By.ID, "message").text
    listed = [line for line in server.devices().splitlines() if "tab left open" in line]
    assert listed and "revoked" in listed[0], server.devices()


def test_usage_and_quota(world, browser):
    server, token, mount = world
    subprocess.run([BIN, "admin", "set-quota", "--data", server.data, "--account", "alice", "50M"], check=True, capture_output=True)
    write(os.path.join(mount.path, "a.bin"), os.urandom(5_000_000))
    mount.settled()
    sign_in(browser, server, token)
    browser.find_element(By.LINK_TEXT, "Usage").click()
    wait_for("the usage page", lambda: browser.find_elements(By.ID, "usage"))
    screenshot(browser, "usage")
    used = browser.find_element(By.ID, "used").text
    assert used.endswith("MB") and 5.0 <= float(used.split()[0]) < 5.2, used
    assert browser.find_element(By.ID, "quota").text == "52 MB"
