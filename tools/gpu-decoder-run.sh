#!/usr/bin/env bash
# GPU speech decoder experiment (issue 7): stage, then run test_gpu_decoder + qtts bench-decoder.
#
#   QTTS_GPU_BUILD=/work/main/build-gpudec bash tools/gpu-decoder-run.sh build
#       builds qtts_cli + test_gpu_decoder through tools/gpu-run.sh build and adds the golden
#       decoder_long scenario next to the payload.
#   run(command="QTTS_GPU_BUILD=$PWD/build-gpudec bash tools/gpu-decoder-run.sh device",
#       carry=["build-gpudec/dist"])
#       on the device: unpack, run the test (label gpu) and the benchmark; logs/JSON to $OUT.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${QTTS_GPU_BUILD:-$ROOT/build-gpudec}
DIST=$BUILD/dist

case "${1:-}" in
build)
    QTTS_GPU_BUILD=$BUILD QTTS_STAGE_TESTS="test_gpu_decoder" bash "$ROOT/tools/gpu-run.sh" build
    cp "${QTTS_REFERENCE_DIR:-$ROOT/../shared/reference}/golden/tiny-customvoice--decoder_long.safetensors" "$DIST/"
    ls -la "$DIST"
    ;;
device)
    out=${OUT:-/tmp/qtts-out}
    q=/tmp/qtts-gpu
    mkdir -p "$out" "$q"
    t0=$SECONDS
    if command -v xz >/dev/null; then
        xz -dc "$DIST/payload.tar.xz" | tar -C "$q" -xf -
    else
        python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" \
            "$DIST/payload.tar.xz" "$q"
    fi
    ln -sf "$q/ref/speech_tokenizer.safetensors" "$q/ref/models/tiny-customvoice/speech_tokenizer/model.safetensors"
    cp "$DIST/tiny-customvoice--decoder_long.safetensors" "$q/ref/golden/"
    export LD_LIBRARY_PATH=$q/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
    export QTTS_REFERENCE_DIR=$q/ref
    export QTTS_LOG_LEVEL=${QTTS_LOG_LEVEL:-info}
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee "$out/summary.txt"
    echo "unpacked in $((SECONDS - t0)) s" | tee -a "$out/summary.txt"
    rc=0
    t=$SECONDS
    timeout "${QTTS_TEST_TIMEOUT:-300}" env QTTS_TEST_LABEL=gpu "$q/bin/test_gpu_decoder" --durations yes \
        >"$out/test_gpu_decoder.log" 2>&1 || rc=$?
    echo "test_gpu_decoder rc=$rc $((SECONDS - t)) s: $(tail -n 2 "$out/test_gpu_decoder.log" | tr '\n' ' ')" | tee -a "$out/summary.txt"
    t=$SECONDS
    rc2=0
    timeout "${QTTS_BENCH_TIMEOUT:-240}" "$q/bin/qtts" bench-decoder ${QTTS_BENCH_ARGS:-} --json "$out/bench-decoder.json" \
        >"$out/bench-decoder.log" 2>&1 || rc2=$?
    echo "bench-decoder rc=$rc2 $((SECONDS - t)) s" | tee -a "$out/summary.txt"
    grep -E "GPU|full-size|tiny|graph|rope|conv|SNR|passed|failed|FAILED" "$out/test_gpu_decoder.log" | head -60 | tee -a "$out/summary.txt" || true
    tail -n 16 "$out/bench-decoder.log" | tee -a "$out/summary.txt"
    [ "$rc" -eq 0 ] && [ "$rc2" -eq 0 ]
    ;;
*)
    echo "usage: tools/gpu-decoder-run.sh build|device" >&2
    exit 2
    ;;
esac
