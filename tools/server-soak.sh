#!/usr/bin/env bash
# Soak run of `qtts serve` with the real engine: N mixed requests from P parallel curl clients,
# the server's resident memory sampled as they go, then SIGTERM and a clean exit. Run it on an
# AddressSanitizer build to have LeakSanitizer check the whole server at exit:
#
#   cmake -S . -B build-asan -DQTTS_CUDA=OFF -DQTTS_SANITIZE_ADDRESS=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQTTS_BUILD_TESTS=OFF
#   cmake --build build-asan --target qtts_cli -j2
#   tools/server-soak.sh build-asan/qtts            # 500 requests, 16 clients
#
#   tools/server-soak.sh QTTS_BINARY [REQUESTS] [CLIENTS] [MODEL_DIR]
#
# Requests rotate over: streamed Ogg Opus, whole WAV, streamed PCM, malformed JSON (400), an
# unknown voice (400), a client that vanishes mid-stream, and a plain TCP client (nc). Each is
# capped at 1 s of audio (--max-audio-seconds) so the run measures the server, not the model.
# The server admits 2 × CLIENTS streams: a vanished client's stream is freed within a chunk,
# and its worker's next request must not race that into a 429. Admission control is off: the run
# measures the server, not whether the machine keeps CLIENTS listeners in real time.
# Exit status: non-zero when a request got an unexpected status, the server did not exit
# cleanly, or the sanitizer reported anything. The RSS table goes to stdout.
set -euo pipefail

QTTS=${1:?usage: tools/server-soak.sh QTTS_BINARY [REQUESTS] [CLIENTS] [MODEL_DIR]}
REQUESTS=${2:-500}
CLIENTS=${3:-16}
MODEL=${4:-}
PORT=${QTTS_SOAK_PORT:-18089}
TCP_PORT=$((PORT + 1))
WORK=$(mktemp -d /tmp/qtts-soak.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:exitcode=23}
model_args=()
[ -n "$MODEL" ] && model_args=(--model "$MODEL")
"$QTTS" serve "${model_args[@]}" --port "$PORT" --tcp-port "$TCP_PORT" --max-streams $((2 * CLIENTS)) \
    --admission off --max-audio-seconds 1 --log-level warn >"$WORK/server.log" 2>&1 &
SERVER=$!
for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1 && break  # 503 while the model loads
    kill -0 "$SERVER" 2>/dev/null || { cat "$WORK/server.log"; exit 1; }
    sleep 0.1
done
VOICE=$(curl -s "http://127.0.0.1:$PORT/v1/audio/voices" | python3 -c 'import json,sys; v=json.load(sys.stdin).get("voices",[]); print(v[0]["id"] if v and isinstance(v[0],dict) else (v[0] if v else ""))' 2>/dev/null || true)
body() { printf '{"model":"qtts","input":"Hi there.","response_format":"%s"%s%s}' "$1" "$2" \
    "${VOICE:+,\"voice\":\"$VOICE\"}"; }
body opus ',"stream":true' >"$WORK/b0"
body wav '' >"$WORK/b1"
body pcm ',"stream":true' >"$WORK/b2"
printf '{"input": "unterminated' >"$WORK/b3"
printf '{"model":"qtts","input":"Hi.","voice":"no-such-voice"}' >"$WORK/b4"
body opus ',"stream":true' >"$WORK/b5"
echo 'Hi there.' >"$WORK/line"
URL="http://127.0.0.1:$PORT/v1/audio/speech"

rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$SERVER/status"; }
one_request() {  # index -> one line "index kind result"
    local i=$1 k=$(($1 % 7))
    case $k in
        5) echo "$i vanish $(curl -s -N --max-time 0.2 -o /dev/null -w '%{http_code}' --data-binary @"$WORK/b5" "$URL" || true)" ;;
        6) timeout 60 nc 127.0.0.1 "$TCP_PORT" <"$WORK/line" >"$WORK/tcp$i" || true
           echo "$i tcp $(head -c 4 "$WORK/tcp$i")"
           grep -a -q '^ERR' "$WORK/tcp$i" && head -c 300 "$WORK/tcp$i" >>"$WORK/tcp-errors" 
           rm -f "$WORK/tcp$i" ;;
        *) echo "$i http$k $(curl -s -N --max-time 60 -o /dev/null -w '%{http_code}' --data-binary @"$WORK/b$k" "$URL")" ;;
    esac
}

echo "requests rss_mb"
echo "0 $(awk "BEGIN {print $(rss_kb) / 1024}")"
t0=$SECONDS
done_count=0
step=$((CLIENTS * 4))
while [ "$done_count" -lt "$REQUESTS" ]; do
    n=$((REQUESTS - done_count < step ? REQUESTS - done_count : step))
    pids=()
    for c in $(seq 0 $((CLIENTS - 1))); do
        (for i in $(seq $((done_count + c)) "$CLIENTS" $((done_count + n - 1))); do one_request "$i"; done) >>"$WORK/results" &
        pids+=($!)
    done
    wait "${pids[@]}"
    done_count=$((done_count + n))
    echo "$done_count $(awk "BEGIN {print $(rss_kb) / 1024}")"
done
elapsed=$((SECONDS - t0))

bad=$(awk '($2 ~ /^http[012]$/ && $3 != "200") || ($2 ~ /^http[34]$/ && $3 != "400") || ($2 == "tcp" && $3 != "OggS")' "$WORK/results" | wc -l)
total=$(wc -l <"$WORK/results")
echo "requests: $total in ${elapsed}s, unexpected results: $bad"
awk '{n[$2 " " $3]++} END {for (k in n) print "  " k ": " n[k]}' "$WORK/results" | sort
curl -s "http://127.0.0.1:$PORT/metrics" | grep -E '^qtts_(requests_total|errors_total|active_streams|streams_[a-z]+_total) ' || true

[ -s "$WORK/tcp-errors" ] && { echo "TCP errors:"; head -5 "$WORK/tcp-errors"; }
kill -TERM "$SERVER"
rc=0
wait "$SERVER" || rc=$?
echo "server exit status: $rc"
if grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:' "$WORK/server.log"; then
    grep -E -A 12 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:' "$WORK/server.log" | head -60
    echo "sanitizer: FAILED"
    exit 1
fi
echo "sanitizer: clean"
[ "$rc" -eq 0 ] && [ "$bad" -eq 0 ] && [ "$total" -eq "$REQUESTS" ]
