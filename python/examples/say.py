#!/usr/bin/env python3
"""Speaks a sentence into a 16-bit WAV file through the qtts Python bindings (python/qtts.py),
with the standard library only.

    python3 python/examples/say.py "Hello from Python." hello.wav --backend cpu

Without --model it uses the embedded demo model (random weights: speech-shaped noise, not words).
The library is found as qtts.py describes ($QTTS_LIBRARY, ../build/libqtts.so, the system path).
"""

import argparse
import array
import os
import sys
import time
import wave

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
import qtts  # noqa: E402  (found next to this folder)


def to_pcm16(samples):
    """Float samples in [-1, 1] to little-endian 16-bit PCM bytes (clipped)."""
    out = array.array("h", (int(max(-1.0, min(1.0, x)) * 32767.0) for x in samples))
    if sys.byteorder == "big":
        out.byteswap()
    return out.tobytes()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("text")
    ap.add_argument("out", help="the WAV file to write")
    ap.add_argument("--model", help="checkpoint folder (default: the demo model)")
    ap.add_argument("--backend", default="auto", help="auto, cpu or cuda")
    ap.add_argument("--speaker")
    ap.add_argument("--language")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--max-frames", type=int, default=0)
    args = ap.parse_args()

    try:
        with qtts.Engine(model_dir=args.model, backend=args.backend) as engine:
            backend = engine.backend
            t0 = time.monotonic()
            first = None
            samples = 0
            # The file only once the request is accepted: a refused one leaves nothing behind.
            with engine.speak(args.text, speaker=args.speaker, language=args.language, seed=args.seed,
                              max_frames=args.max_frames) as stream, wave.open(args.out, "wb") as wav:
                wav.setnchannels(1)
                wav.setsampwidth(2)
                wav.setframerate(qtts.SAMPLE_RATE)
                for chunk in stream:  # written as it arrives
                    if first is None:
                        first = time.monotonic() - t0
                    wav.writeframes(to_pcm16(chunk))
                    samples += len(chunk)
                m = stream.metrics()
    except qtts.QttsError as e:
        print("say.py: %s" % e, file=sys.stderr)
        return 1
    print("wrote %s: %d samples (%.2f s), first audio after %.1f ms, stop: %s, backend %s"
          % (args.out, samples, samples / qtts.SAMPLE_RATE, (first or 0.0) * 1000.0, m["stop_reason"], backend))
    return 0


if __name__ == "__main__":
    sys.exit(main())
