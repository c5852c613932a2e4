"""What the Python scripts of bench/ share: reading safetensors headers and sampling
this process's private memory (RssAnon)."""

import json
import os
import struct
import threading


def safetensors_headers(src):
    """(path, first data byte, header without __metadata__) of every *.safetensors file
    of the directory SRC, in name order."""
    for file in sorted(os.listdir(src)):
        if not file.endswith(".safetensors"):
            continue
        path = os.path.join(src, file)
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
        header.pop("__metadata__", None)
        yield path, 8 + n, header


def rss_anon_kib():
    """This process's private memory (RssAnon), KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


class PeakSampler(threading.Thread):
    """The peak of rss_anon_kib() from its creation to stop(), sampled every INTERVAL s."""

    def __init__(self, interval=0.005):
        super().__init__(daemon=True)
        self.interval = interval
        self.peak = rss_anon_kib()
        self.done = threading.Event()

    def run(self):
        while not self.done.wait(self.interval):
            self.peak = max(self.peak, rss_anon_kib())

    def stop(self):
        self.done.set()
        self.join()
        self.peak = max(self.peak, rss_anon_kib())
        return self.peak
