"""TEST DOUBLE — `cron` for the lab's hosts, whose rootfs has no cron (tests/lab/rootfs.py).

What it keeps of Debian's cron: the daemon at /usr/sbin/cron run by cron.service, its process named `cron`
(a script's comm is its file name), and each `@reboot` line of /var/spool/cron/crontabs/USER run once when
it starts (as cron does at boot) by a forked `cron` child as `/bin/sh -c COMMAND`, as USER, from USER's home.
Nothing else of cron: no other schedule, no mail.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

DAEMON = '''#!/usr/bin/python3
# TEST DOUBLE cron (tests/doubles/cron_standin.py): runs the @reboot lines of /var/spool/cron/crontabs/*
import os, pwd, time
FOLDER = "/var/spool/cron/crontabs"
for user in sorted(os.listdir(FOLDER)) if os.path.isdir(FOLDER) else []:
    with open(os.path.join(FOLDER, user)) as crontab:
        lines = crontab.read().splitlines()
    for line in lines:
        words = line.split(None, 1)
        if len(words) == 2 and words[0] == "@reboot":
            account = pwd.getpwnam(user)
            if os.fork() == 0:
                os.setsid()
                os.setgid(account.pw_gid)
                os.setuid(account.pw_uid)
                os.chdir(account.pw_dir)
                if os.fork() == 0:
                    os.execv("/bin/sh", ["/bin/sh", "-c", words[1]])
                os.wait()
                os._exit(0)
while True:
    time.sleep(3600)
'''
UNIT = """[Unit]
Description=TEST DOUBLE cron (@reboot lines only)

[Service]
ExecStart=/usr/sbin/cron
KillMode=process

[Install]
WantedBy=multi-user.target
"""


def install(host, crontab: str, user: str = "root") -> None:
    """cron's double on `host` (enabled, not started), with `crontab` as USER's crontab."""
    with tempfile.TemporaryDirectory() as folder:
        for name, text, remote, mode in (("cron", DAEMON, "/usr/sbin/cron", "0755"),
                                         ("cron.service", UNIT, "/etc/systemd/system/cron.service", "0644"),
                                         ("crontab", crontab, f"/var/spool/cron/crontabs/{user}", "0600")):
            local = Path(folder) / name
            local.write_text(text)
            host.ssh("mkdir -p /var/spool/cron/crontabs")
            host.put(local, remote, mode=mode)
    host.ssh("systemctl daemon-reload && systemctl enable cron.service")
