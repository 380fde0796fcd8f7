"""The Python bindings (python/qtts.py) over libqtts.so, on the embedded demo model with the CPU
backend: audio out of the iterator and the callback, request fields, incremental text, barge-in,
engine counters, bad input as exceptions carrying qtts_last_error(), and the say.py example.

Run by ctest (test_python_bindings) with the system python3; QTTS_LIBRARY names the library of the
build tree. Standard library only."""

import array
import os
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import wave

# Nothing written into the source tree (the module and the example are imported from it).
sys.dont_write_bytecode = True
os.environ["PYTHONDONTWRITEBYTECODE"] = "1"

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.normpath(os.path.join(HERE, os.pardir, os.pardir))
sys.path.insert(0, os.path.join(SOURCE, "python"))
if os.environ.get("QTTS_TEST_CACHE_DIR"):
    os.environ.setdefault("QTTS_CACHE_DIR", os.environ["QTTS_TEST_CACHE_DIR"])

import qtts  # noqa: E402

FRAME = qtts.SAMPLES_PER_FRAME


class BindingsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.engine = qtts.Engine(backend="cpu", max_streams=4)

    @classmethod
    def tearDownClass(cls):
        cls.engine.close()

    def test_version_and_backend(self):
        self.assertRegex(qtts.version(), r"^\d+\.\d+\.\d+$")
        self.assertEqual(self.engine.backend, "cpu")

    def test_iterator_gives_every_sample(self):
        requests_before = self.engine.stats()["requests"]
        with self.engine.speak("Hello from Python.", seed=3, max_frames=6) as stream:
            total = 0
            for chunk in stream:
                self.assertIsInstance(chunk, array.array)
                self.assertEqual(chunk.typecode, "f")
                self.assertGreater(len(chunk), 0)
                total += len(chunk)
            m = stream.metrics()
            self.assertTrue(stream.finished)
        self.assertGreater(total, 0)
        self.assertEqual(total % FRAME, 0)
        self.assertEqual(total, m["samples"])
        self.assertLessEqual(m["frames"], 6)
        self.assertIn(m["stop_reason"], ("eos", "max_frames", "frame_budget"))
        self.assertGreaterEqual(m["first_audio_ms"], 0.0)
        self.assertEqual(self.engine.stats()["requests"], requests_before + 1)

    def test_greedy_ignores_the_seed_sampling_does_not(self):
        a = self.engine.synthesize("Greedy from Python.", greedy=True, seed=1, max_frames=3)
        b = self.engine.synthesize("Greedy from Python.", greedy=True, seed=2, max_frames=3)
        self.assertEqual(len(a), 3 * FRAME)
        self.assertEqual(a, b)
        c = self.engine.synthesize("Greedy from Python.", seed=1, max_frames=3)
        d = self.engine.synthesize("Greedy from Python.", seed=2, max_frames=3)
        self.assertNotEqual(c, d)

    def test_empty_text_raises(self):
        with self.assertRaises(qtts.QttsError) as cm:
            self.engine.speak("")
        self.assertEqual(cm.exception.code, qtts.INVALID_ARGUMENT)
        self.assertEqual(cm.exception.name, "QTTS_ERROR_INVALID_ARGUMENT")
        self.assertIn("empty", cm.exception.message)

    def test_unknown_speaker_raises(self):
        with self.assertRaises(qtts.QttsError) as cm:
            self.engine.speak("Hello.", speaker="nobody_by_this_name")
        self.assertIn("nobody_by_this_name", cm.exception.message)
        self.assertNotEqual(cm.exception.code, 0)

    def test_other_bad_requests_raise(self):
        for kwargs in ({"language": "klingon"}, {"max_frames": -1},
                       {"ref_audio": [0.0] * 2400, "ref_text": "Silence."}):
            with self.subTest(**{k: str(v)[:20] for k, v in kwargs.items()}):
                with self.assertRaises(qtts.QttsError) as cm:
                    self.engine.speak("Hello.", **kwargs)
                self.assertTrue(cm.exception.message)

    def test_bad_engine_options_raise(self):
        with self.assertRaises(qtts.QttsError) as cm:
            qtts.Engine(backend="abacus")
        self.assertEqual(cm.exception.code, qtts.INVALID_ARGUMENT)
        with self.assertRaises(qtts.QttsError):
            qtts.Engine(model_dir="/nonexistent/qtts-model", backend="cpu")

    def test_incremental_text(self):
        with self.engine.speak("The answer", incremental=True, greedy=True, max_frames=8) as stream:
            stream.append(" comes in")
            stream.append(" pieces.")
            stream.close_text()
            with self.assertRaises(qtts.QttsError):
                stream.append(" too late")
            audio = stream.read_all()
        self.assertGreater(len(audio), 0)
        self.assertLessEqual(len(audio), 8 * FRAME)

    def test_discard_drops_the_queued_audio(self):
        # Text left open: the stream waits for more once it has spoken it, so the discard always
        # finds it running, however slow this thread is.
        with self.engine.speak("A long answer nobody listens to.", incremental=True, greedy=True, max_frames=200) as stream:
            deadline = time.monotonic() + 60
            while stream.available < 3 * FRAME and time.monotonic() < deadline:
                time.sleep(0.005)
            self.assertGreaterEqual(stream.available, 3 * FRAME)
            stream.discard()
            self.assertEqual(len(stream.read()), 0)
            while not stream.finished and time.monotonic() < deadline:
                stream.wait(50)
            self.assertTrue(stream.finished)
            self.assertEqual(len(stream.read()), 0)
            self.assertEqual(stream.metrics()["stop_reason"], "cancelled")

    def test_callback_delivers_on_the_library_thread(self):
        got = array.array("f")
        lasts = []
        threads = set()
        done = threading.Event()

        def on_chunk(chunk, last):
            threads.add(threading.get_ident())
            if last:
                lasts.append(True)
                done.set()
            else:
                got.extend(chunk)

        with self.engine.speak("Delivered by a callback.", greedy=True, max_frames=6, on_chunk=on_chunk) as stream:
            self.assertTrue(done.wait(60))
            # `finished` turns true once the last call has returned, which may be a moment after
            # `done` was set inside it: wait for it rather than race the library thread.
            self.assertTrue(stream.wait(10000))
            self.assertTrue(stream.finished)
            m = stream.metrics()
        self.assertEqual(lasts, [True])
        self.assertEqual(len(got), m["samples"])
        self.assertGreater(len(got), 0)
        self.assertNotIn(threading.get_ident(), threads)

    def test_released_stream_raises(self):
        stream = self.engine.speak("Released.", max_frames=2)
        stream.release()
        stream.release()  # twice is fine
        with self.assertRaises(qtts.QttsError):
            stream.read()

    def test_say_example_writes_a_wav(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "hello.wav")
            script = os.path.join(SOURCE, "python", "examples", "say.py")
            run = subprocess.run([sys.executable, script, "Hello from the example.", out, "--backend", "cpu",
                                  "--max-frames", "4", "--seed", "4"], capture_output=True, text=True, timeout=300)
            self.assertEqual(run.returncode, 0, run.stderr)
            with wave.open(out, "rb") as w:
                self.assertEqual(w.getframerate(), 24000)
                self.assertEqual(w.getnchannels(), 1)
                self.assertEqual(w.getsampwidth(), 2)
                frames = w.getnframes()
            self.assertGreater(frames, 0)
            self.assertEqual(frames % FRAME, 0)
            self.assertIn("wrote %s: %d samples" % (out, frames), run.stdout)

            bad = os.path.join(tmp, "empty.wav")
            run = subprocess.run([sys.executable, script, "", bad, "--backend", "cpu"], capture_output=True,
                                 text=True, timeout=300)
            self.assertEqual(run.returncode, 1)
            self.assertIn("QTTS_ERROR_INVALID_ARGUMENT", run.stderr)
            self.assertFalse(os.path.exists(bad))


class LibraryTest(unittest.TestCase):
    def test_missing_library_is_a_clear_error(self):
        with self.assertRaises(OSError) as cm:
            qtts.load_library("/nonexistent/libqtts.so")
        self.assertIn("QTTS_LIBRARY", str(cm.exception))


if __name__ == "__main__":
    unittest.main(verbosity=2)
