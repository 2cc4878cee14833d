"""Scrape an exporter every STEP seconds for SECONDS; write the samples, timestamped, as a history file.

usage: record.py URL SECONDS STEP OUT   (OUT is what `truegpu analyze --input` reads)
"""

import sys
import time

import requests


def main(url: str, seconds: float, step: float, out: str) -> None:
    lines: list[str] = []
    nxt = time.time()
    end = nxt + seconds
    while nxt < end:
        time.sleep(max(0.0, nxt - time.time()))
        ts = time.time()
        nxt += step
        try:
            text = requests.get(url, timeout=2).text
        except requests.RequestException as exc:
            print("scrape failed:", exc, flush=True)
            continue
        lines += [f"{line} {ts:.3f}" for line in text.splitlines() if line and not line.startswith("#")]
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n# EOF\n")
    print("recorded", len(lines), "samples", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4])
