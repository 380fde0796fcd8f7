// The browser page of `qtts serve` (audio_io/server/web/index.html) in a real headless Chromium,
// driven by puppeteer-core: `qtts serve` with the embedded demo model on the CPU, on a free port;
// the page loads under its Content-Security-Policy, lists the server's voices, speaks typed text
// over the WebSocket (PCM, and Opus where the browser decodes it), reports a numeric first-audio
// time and plays the audio out; an over-long text shows the server's error; Stop stops.
//
// usage: node test_page.mjs --qtts PATH --chromium PATH   (run by test_web_page.sh, ctest test_web_page)
// exit 0: passed; 1: failed (the reason is printed).
import { spawn } from 'node:child_process';
import puppeteer from 'puppeteer-core';

const MAX_TEXT_BYTES = 200;   // --max-text-bytes, for the error case
const DEADLINE_MS = 90_000;   // the whole test; it normally takes a few seconds

function argValue(name) {
  const i = process.argv.indexOf(name);
  if (i < 0 || i + 1 >= process.argv.length) throw new Error(`missing ${name} PATH`);
  return process.argv[i + 1];
}

class TestFailure extends Error {}

function check(condition, message) {
  if (!condition) throw new TestFailure(message);
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Script errors and policy violations seen in the page, printed with any failure.
const problems = [];

// Starts `qtts serve --port 0` and resolves with its port (printed as http://127.0.0.1:PORT).
function serveStart(qtts) {
  const args = ['serve', '--port', '0', '--backend', 'cpu', '--max-text-bytes', String(MAX_TEXT_BYTES),
    '--max-audio-seconds', '1.5', '--log-level', 'info'];
  const child = spawn(qtts, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  const port = new Promise((resolve, reject) => {
    const scan = (chunk) => {
      log += chunk.toString();
      const m = /http:\/\/127\.0\.0\.1:(\d+)/.exec(log);
      if (m) resolve(Number(m[1]));
    };
    child.stdout.on('data', scan);
    child.stderr.on('data', scan);
    child.on('error', reject);
    child.on('exit', (code, signal) => reject(new Error(`qtts serve exited (${code ?? signal}) before listening:\n${log}`)));
  });
  return { child, port, log: () => log };
}

async function readyWait(base, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    try {
      const res = await fetch(base + '/readyz');
      if (res.status === 200) return;
    } catch (e) { /* not yet */ }
    await sleep(100);
  }
  throw new TestFailure(`the server was not ready after ${timeoutMs} ms`);
}

// What the page shows, read from its DOM as a user would see it.
async function pageView(page) {
  return page.evaluate(() => {
    const text = (id) => document.getElementById(id).textContent;
    const error = document.getElementById('error');
    return {
      state: document.body.dataset.state,
      stateText: text('state'),
      error: error.hidden ? '' : error.textContent,
      firstAudio: text('first-audio-ms'),
      firstPlay: text('first-play-ms'),
      serverTtfa: text('server-ttfa-ms'),
      frames: Number(text('frames')),
      received: text('received-seconds'),
      underruns: text('underruns'),
      stopReason: text('stop-reason'),
      playback: text('playback-rate'),
    };
  });
}

async function stateWait(page, states, timeoutMs, what) {
  try {
    await page.waitForFunction((s) => s.includes(document.body.dataset.state), { timeout: timeoutMs, polling: 50 }, states);
  } catch (e) {
    const v = await pageView(page);
    throw new TestFailure(`${what}: the page did not reach ${states.join('/')} within ${timeoutMs} ms; it shows ${JSON.stringify(v)}`);
  }
}

async function textSet(page, text) {
  await page.$eval('#text', (el) => { el.value = ''; });
  await page.type('#text', text);
}

const msPattern = /^(\d+(\.\d+)?) ms$/;

// One utterance, typed and spoken; returns what the page showed at the end.
async function speakOnce(page, format, text) {
  await page.select('#format', format);
  await textSet(page, text);
  await page.click('#speak');
  await stateWait(page, ['done', 'error', 'stopped'], 30_000, `speaking (${format})`);
  const v = await pageView(page);
  check(v.state === 'done', `${format}: the utterance ended in state ${v.state} (${v.stateText}); error: ${v.error}`);
  check(v.error === '', `${format}: an error is shown: ${v.error}`);
  check(v.frames > 0, `${format}: no audio messages were received`);
  const first = msPattern.exec(v.firstAudio);
  check(first && Number(first[1]) > 0, `${format}: first-audio time is not a number of ms: "${v.firstAudio}"`);
  const played = msPattern.exec(v.firstPlay);
  check(played && Number(played[1]) > 0, `${format}: first-played time is not a number of ms: "${v.firstPlay}"`);
  check(msPattern.test(v.serverTtfa), `${format}: the server's first-audio time is missing: "${v.serverTtfa}"`);
  check(/^\d+\.\d\d s$/.test(v.received) && parseFloat(v.received) > 0, `${format}: no audio seconds counted: "${v.received}"`);
  check(['eos', 'frame_budget', 'max_frames'].includes(v.stopReason), `${format}: stop reason "${v.stopReason}"`);
  console.log(`${format}: first audio received ${v.firstAudio}, played ${v.firstPlay} (server ${v.serverTtfa}), ` +
              `${v.frames} messages, ${v.received}, underruns ${v.underruns}, ${v.stopReason}, playback ${v.playback}`);
  return v;
}

async function run() {
  const qtts = argValue('--qtts');
  const chromium = argValue('--chromium');
  const serve = serveStart(qtts);
  let browser = null;
  try {
    const port = await serve.port;
    const base = `http://127.0.0.1:${port}`;
    await readyWait(base, 60_000);
    const voices = await (await fetch(base + '/v1/audio/voices')).json();

    const args = ['--autoplay-policy=no-user-gesture-required', '--disable-gpu', '--disable-dev-shm-usage',
      '--no-first-run', '--mute-audio'];
    // Chromium's sandbox refuses to start as root (CI containers); the page is our own.
    if (process.getuid && process.getuid() === 0) args.push('--no-sandbox');
    browser = await puppeteer.launch({ executablePath: chromium, headless: true, args, timeout: 30_000 });
    const page = await browser.newPage();
    page.on('pageerror', (e) => problems.push('page error: ' + e.message));
    page.on('console', (m) => {
      // A policy violation means the compiled-in hashes do not match the page.
      if (/Content Security Policy|Refused to/i.test(m.text())) problems.push('console: ' + m.text());
    });

    const res = await page.goto(base + '/', { waitUntil: 'load' });
    check(res.status() === 200, `GET / answered ${res.status()}`);
    await stateWait(page, ['idle'], 15_000, 'loading the voices');
    const options = await page.$$eval('#voice option', (os) => os.map((o) => o.value));
    const expected = voices.voices.length ? voices.voices : [''];
    check(JSON.stringify(options) === JSON.stringify(expected),
      `the voice list ${JSON.stringify(options)} is not the server's ${JSON.stringify(expected)}`);
    if (voices.voices.length > 1) await page.select('#voice', voices.voices[1]);

    await speakOnce(page, 'pcm', 'Hello from the browser test.');

    const opusOk = await page.$eval('#format option[value="opus"]', (o) => !o.disabled);
    if (opusOk) {
      await speakOnce(page, 'opus', 'And once more in Opus.');
    } else {
      console.log('opus: this Chromium has no WebCodecs Opus decoder; only PCM was tested');
    }

    // Blank text: the page says so and sends nothing.
    await page.select('#format', 'pcm');
    await page.$eval('#text', (el) => { el.value = '   '; });
    await page.click('#speak');
    let v = await pageView(page);
    check(v.error.includes('type some text'), `blank text: the page shows "${v.error}"`);
    check(v.state === 'done', `blank text changed the state to ${v.state}`);

    // Over the server's text limit: the server refuses the start; its words appear on the page.
    await page.$eval('#text', (el, n) => { el.value = 'a'.repeat(n); }, MAX_TEXT_BYTES + 50);
    await page.click('#speak');
    await stateWait(page, ['error'], 10_000, 'an over-long text');
    v = await pageView(page);
    check(v.error.startsWith('server: ') && v.error.includes(`the limit is ${MAX_TEXT_BYTES} bytes`),
      `over-long text: the error shown is "${v.error}", not the server's`);
    check(v.frames === 0, 'over-long text: audio was received');
    console.log(`error case shows: ${v.error}`);

    // Stop while speaking: back to silence and a usable page.
    await textSet(page, 'This sentence is stopped before it is over.');
    await page.click('#speak');
    await page.waitForFunction(() => Number(document.getElementById('frames').textContent) > 0, { timeout: 30_000, polling: 20 });
    await page.click('#stop');
    await stateWait(page, ['stopped'], 5_000, 'stopping');
    check(await page.$eval('#speak', (b) => !b.disabled), 'Speak is still disabled after Stop');

    // And the connection is still good for another utterance.
    await speakOnce(page, 'pcm', 'Speaking again after a stop.');

    check(problems.length === 0, problems.join('\n'));
  } finally {
    if (browser) await browser.close().catch(() => {});
    serve.child.kill('SIGTERM');
    await Promise.race([new Promise((r) => serve.child.once('exit', r)), sleep(5000)]);
    if (serve.child.exitCode === null && serve.child.signalCode === null) serve.child.kill('SIGKILL');
  }
}

const timer = setTimeout(() => {
  console.error(`FAILED: the test did not finish within ${DEADLINE_MS / 1000} s`);
  process.exit(1);
}, DEADLINE_MS);

try {
  const t0 = Date.now();
  await run();
  clearTimeout(timer);
  console.log(`PASSED in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  process.exit(0);
} catch (e) {
  clearTimeout(timer);
  console.error('FAILED: ' + (e instanceof TestFailure ? e.message : (e && e.stack) || e));
  if (problems.length) console.error('the page reported:\n' + problems.join('\n'));
  process.exit(1);
}
