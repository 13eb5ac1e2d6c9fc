"""The web view behind nginx with dist/nginx/nimbus.conf as it is (only its addresses, certificate
and paths filled in), terminating TLS: the session cookie is `Secure`, and an upload larger than
nginx's limit for the device API's bodies streams through (docs/web.md, docs/deploy.md)."""

import os
import random
import shutil
import subprocess
import tempfile
import time

import pytest
from selenium.webdriver.common.by import By

from conftest import ROOT, wait_for
from test_web import open_container


@pytest.fixture
def server_args():
    return ("--trusted-proxy", "127.0.0.1")


class Nginx:
    def __init__(self, upstream):
        self.dir = tempfile.mkdtemp(prefix="nimbus-web-nginx-")
        key, cert = os.path.join(self.dir, "server.key"), os.path.join(self.dir, "server.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                        "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", cert], check=True, capture_output=True)
        with open(os.path.join(ROOT, "dist", "nginx", "nimbus.conf")) as f:
            conf = f.read()
        conf = (conf.replace("server 127.0.0.1:7070;", f"server {upstream};")
                .replace("/etc/nimbus/fullchain.pem", cert).replace("/etc/nimbus/privkey.pem", key))
        os.makedirs(os.path.join(self.dir, "tmp"))
        self.proc = None
        for _ in range(10):
            self.port = random.randint(20000, 60000)
            with open(os.path.join(self.dir, "nimbus.conf"), "w") as f:
                f.write(conf.replace("listen 443 ssl;", f"listen 127.0.0.1:{self.port} ssl;"))
            with open(os.path.join(self.dir, "nginx.conf"), "w") as f:
                t = os.path.join(self.dir, "tmp")
                f.write(f"""user root; daemon off; worker_processes 1; pid {self.dir}/nginx.pid; error_log {self.dir}/error.log;
events {{ worker_connections 512; }}
http {{ access_log off; client_body_temp_path {t}/body; proxy_temp_path {t}/proxy; fastcgi_temp_path {t}/fastcgi;
uwsgi_temp_path {t}/uwsgi; scgi_temp_path {t}/scgi; include {self.dir}/nimbus.conf; }}
""")
            self.proc = subprocess.Popen(["nginx", "-p", self.dir, "-c", os.path.join(self.dir, "nginx.conf")],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            self.url = f"https://127.0.0.1:{self.port}"
            for _ in range(100):
                if self.proc.poll() is not None:
                    break
                if subprocess.run(["curl", "-fsSk", "--max-time", "2", self.url + "/healthz"], capture_output=True).returncode == 0:
                    return
                time.sleep(0.05)
            self.stop()
        raise AssertionError("nginx did not start: " + open(os.path.join(self.dir, "error.log")).read())

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def remove(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def nginx(world):
    n = Nginx(world[0].url[len("http://"):])
    try:
        yield n
    finally:
        n.remove()


def test_behind_nginx_the_cookie_is_secure_and_a_large_upload_streams_through(world, nginx, browser):
    server, token, mount = world
    # The browser talks to nginx; the mount to the server itself.
    code = server.pairing_code(token, "browser")
    browser.get(nginx.url + "/")
    browser.find_element(By.ID, "code").send_keys(code)
    browser.find_element(By.ID, "sign-in").click()
    wait_for("the containers page after signing in", lambda: browser.find_elements(By.ID, "containers"))
    assert browser.get_cookie("nimbus_web")["secure"] is True
    open_container(browser)
    src = tempfile.mkdtemp(prefix="nimbus-web-upload-")
    try:
        data = os.urandom(40_000_000)  # over nginx's 17 MiB limit for the device API's bodies
        with open(os.path.join(src, "video.bin"), "wb") as f:
            f.write(data)
        browser.find_element(By.ID, "upload-files").send_keys(os.path.join(src, "video.bin"))
        panel = browser.find_element(By.ID, "upload")
        wait_for("the upload through nginx", lambda: panel.get_attribute("data-state") in ("done", "failed"), timeout=90)
        states = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#uploads .state")]
        assert panel.get_attribute("data-state") == "done", states
        wait_for("the upload on the mount", lambda: os.path.exists(os.path.join(mount.path, "video.bin")), timeout=10)
        with open(os.path.join(mount.path, "video.bin"), "rb") as f:
            assert f.read() == data
    finally:
        shutil.rmtree(src, ignore_errors=True)
