#!/usr/bin/env python3
"""Randomized multi-device driver for SimulationTests and scripts/soak (docs/sync.md "Simulation").

  sim.py STATE SEED ROUNDS NIMBUS MP...

Runs ROUNDS random operations on the mounts MP... (one per device): create, write, rename,
move, delete, and going offline/online (`nimbus pause|resume`). All choices come from SEED, so
a failing run replays. STATE (JSON) carries across calls: which devices are offline, and for
every (device, item) the last content the device wrote. Contents that must survive are listed
under "must" at the end (`sim.py STATE --finish`): the last content each device wrote to each
item, unless that device deleted the item itself. (An earlier write that the same device
overwrote before it reached the server may be gone: a device syncs states, not every write.)
"""
import json, os, random, subprocess, sys, time

FOLDERS = ["", "d1", "d2"]
NAMES = ["a.txt", "b.txt", "c.txt", "d.txt", "e.txt"]


def itemid(path):
    try:
        return os.getxattr(path, "user.nimbus.itemid").decode()
    except OSError:
        return None


def files(mp):
    out = []
    for f in FOLDERS:
        d = os.path.join(mp, f)
        try:
            out += [os.path.join(f, n) for n in sorted(os.listdir(d)) if os.path.isfile(os.path.join(d, n))]
        except OSError:
            pass
    return sorted(out)


def load(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except FileNotFoundError:
        return {"offline": [], "last": {}, "must": [], "ops": 0}


def flush(state, d):
    """Device d's last contents must now be reachable (it is online, they were written)."""
    for key, content in list(state["last"].items()):
        dev, item = key.split(" ", 1)
        if int(dev) == d:
            state["must"].append([item, content])
            del state["last"][key]


def main():
    path = sys.argv[1]
    state = load(path)
    if sys.argv[2] == "--finish":
        for d in range(8):
            flush(state, d)
        json.dump(state, open(path, "w"))
        return
    seed, rounds, nimbus, mps = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5:]
    rnd = random.Random(seed)
    for r in range(rounds):
        d = rnd.randrange(len(mps))
        mp = mps[d]
        op = rnd.choices(["write", "create", "rename", "move", "delete", "offline", "online"], [6, 3, 1, 1, 1, 1, 1])[0]
        present = files(mp)
        content = "seed %d round %d device %d\n" % (seed, r, d)
        try:
            if op == "offline" and d not in state["offline"]:
                subprocess.run([nimbus, "pause", mp], check=True, capture_output=True)
                state["offline"].append(d)
            elif op == "online" and d in state["offline"]:
                subprocess.run([nimbus, "resume", mp], check=True, capture_output=True)
                state["offline"].remove(d)
            elif op in ("write", "create"):
                if op == "write" and present:
                    rel = rnd.choice(present)
                else:
                    rel = os.path.join(rnd.choice(FOLDERS), rnd.choice(NAMES))
                target = os.path.join(mp, rel)
                with open(target, "w") as fh:
                    fh.write(content)
                    fh.flush()
                    # The item written, asked through the open descriptor: a path may meanwhile
                    # name another item (a remote rename), a descriptor cannot.
                    try:
                        item = os.getxattr(fh.fileno(), "user.nimbus.itemid").decode()
                    except OSError:
                        item = None
                if item:
                    state["last"]["%d %s" % (d, item)] = content
                else:
                    print("round %d device %d: wrote %s but could not tell its item" % (r, d, rel))
            elif op in ("rename", "move") and present:
                rel = rnd.choice(present)
                folder = os.path.dirname(rel) if op == "rename" else rnd.choice(FOLDERS)
                dest = os.path.join(mp, folder, rnd.choice(NAMES))
                if not os.path.exists(dest):
                    os.rename(os.path.join(mp, rel), dest)
            elif op == "delete" and present:
                target = os.path.join(mp, rnd.choice(present))
                fd = os.open(target, os.O_RDONLY)
                try:
                    item = os.getxattr(fd, "user.nimbus.itemid").decode()
                finally:
                    os.close(fd)
                os.unlink(target)
                if item:
                    state["last"].pop("%d %s" % (d, item), None)  # its own delete: nothing to keep
        except OSError as e:
            # A placeholder cannot be opened for writing offline (EIO), a name moved away meanwhile
            # (ENOENT): the program sees the error; nothing was changed.
            print("round %d device %d %s: %s" % (r, d, op, e))
        state["ops"] += 1
        time.sleep(rnd.uniform(0, 0.03))
    json.dump(state, open(path, "w"))


main()
