"""Fixtures of the web view's browser tests: a real `nimbus serve` on 127.0.0.1, a real FUSE mount
of another device of the same account, and Debian's chromium driven headless by selenium.
Every server, mount and browser is ended when the test ends, also when it fails."""

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

import pytest
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("NIMBUS_BINARY", os.path.join(ROOT, ".build", "debug", "nimbus"))
ACCOUNT = "alice"
CONTAINER = "docs"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, check, timeout=15.0, every=0.05):
    """Polls `check` until it returns something truthy; fails the test with `what` after `timeout`.
    A page element gone stale or missing while the page is being replaced (a form's answer, a live refresh)
    counts as not yet: the check is read again, and still fails the test with `what` if it never holds.
    (Chrome reports an element detached while its text is read as a generic error naming a node that
    "does not belong to the document": the same thing.)"""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except (StaleElementReferenceException, NoSuchElementException):
            value = None  # the page was replaced while it was read: read it again
        except WebDriverException as e:
            if "does not belong to the document" not in str(e):
                raise
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(every)


class Server:
    def __init__(self, root, args=()):
        self.data = os.path.join(root, "server")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(os.path.join(root, "serve.log"), "wb")
        self.proc = subprocess.Popen([BIN, "serve", "--data", self.data, "--listen", f"127.0.0.1:{self.port}", *args],
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for("the server answering /healthz", self.healthy)

    def healthy(self):
        try:
            return urllib.request.urlopen(self.url + "/healthz", timeout=1).read() == b"ok\n"
        except OSError:
            return False

    def add_device(self, name):
        out = subprocess.run([BIN, "admin", "add-device", "--data", self.data, "--account", ACCOUNT, "--device", name],
                             check=True, capture_output=True, text=True).stdout
        return out.strip().splitlines()[-1].strip()

    def api(self, token, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read() or b"null")

    def pairing_code(self, token, device):
        return self.api(token, "POST", "/v1/devices/pairing", {"device": device})["code"]

    def devices(self):
        out = subprocess.run([BIN, "admin", "list-devices", "--data", self.data, "--account", ACCOUNT],
                             check=True, capture_output=True, text=True).stdout
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class Mount:
    """A mount of the container by another device of the account (`nimbus mount`)."""

    def __init__(self, root, server, token, name="laptop"):
        self.path = os.path.join(root, "mnt-" + name)
        self.state = os.path.join(root, "state-" + name)
        os.makedirs(self.path)
        token_file = os.path.join(root, "token-" + name)
        with open(token_file, "w") as f:
            f.write(token)
        os.chmod(token_file, 0o600)
        subprocess.run([BIN, "mount", self.path, "--state", self.state, "--server", server.url, "--container", CONTAINER,
                        "--token-file", token_file], check=True, capture_output=True, timeout=60)

    def status(self):
        try:
            with open(os.path.join(self.path, ".nimbus", "status")) as f:
                return f.read()
        except OSError as e:
            return f"unreadable: {e}"

    def settled(self):
        """Waits until the mount has uploaded everything queued."""
        wait_for("the mount's upload queue empty", lambda: "upload-queue: 0\n" in self.status(), timeout=30)

    def unmount(self):
        r = subprocess.run([BIN, "unmount", self.path], capture_output=True, timeout=60)
        if r.returncode != 0 or self.mounted():
            subprocess.run(["fusermount3", "-u", "-z", self.path], capture_output=True)

    def mounted(self):
        with open("/proc/mounts") as f:
            return any(line.split()[1] == self.path for line in f)


@pytest.fixture
def server_args():
    """Arguments of the test's `nimbus serve` beyond data and listener (a test overrides it)."""
    return ()


@pytest.fixture
def world(server_args):
    """A server, the token of device `laptop` and its mount of the container."""
    root = tempfile.mkdtemp(prefix="nimbus-web-")
    server = mount = None
    try:
        server = Server(root, server_args)
        server.root = root
        token = server.add_device("laptop")
        server.api(token, "PUT", f"/v1/containers/{CONTAINER}")
        mount = Mount(root, server, token)
        yield server, token, mount
    finally:
        if mount:
            mount.unmount()
        if server:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def desktop(world):
    """A second mount of the container, by device `desktop` of the same account."""
    server = world[0]
    mount = None
    try:
        mount = Mount(server.root, server, server.add_device("desktop"), name="desktop")
        yield mount
    finally:
        if mount:
            mount.unmount()


@pytest.fixture
def browser():
    downloads = tempfile.mkdtemp(prefix="nimbus-web-downloads-")
    options = webdriver.ChromeOptions()
    # The nginx journey's certificate is made by the test: not one a browser would trust.
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900", "--ignore-certificate-errors"):
        options.add_argument(a)
    options.add_experimental_option("prefs", {"download.default_directory": downloads,
                                              "download.prompt_for_download": False})
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    driver.set_page_load_timeout(20)
    driver.downloads = downloads
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(downloads, ignore_errors=True)
