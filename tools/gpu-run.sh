#!/usr/bin/env bash
# Repeatable GPU run for the CUDA engine (see docs/cuda.md, ../shared/docs/device-gpu.md).
#
#   tools/gpu-run.sh build    on the development machine: configure + build build-gpu (Release,
#                             sm_90, warnings as errors), then stage the GPU binaries, the
#                             non-system shared libraries they need and the tiny reference
#                             models into build-gpu/dist/payload.tar.xz (what travels).
#   tools/gpu-run.sh device   on the GPU machine (the device `run` command, repo root as cwd):
#                             unpack the payload, run the GPU tests, generate full-size random
#                             0.6B / 1.7B checkpoints with `qtts make-model` and benchmark them.
#                             Logs and JSON go to $OUT (or /tmp/qtts-out); a summary is printed last.
#
# Same-call comparison with an earlier build: QTTS_BASELINE_QTTS=/path/to/old/qtts at `build` time
# stages that binary as bin/qtts-baseline; `device` then benchmarks it right before the new one,
# on the same checkpoint, with the same arguments (bench-<preset>-baseline.json).
#
# The device call (carry build-gpu/dist):
#   run(command="bash tools/gpu-run.sh device", carry=["build-gpu/dist"])
# Nothing run there may touch PortAudio: the binaries used here never open an audio device.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${QTTS_GPU_BUILD:-$ROOT/build-gpu}
DIST=$BUILD/dist
GPU_TESTS="test_gpu_kernels test_gpu_lm test_gpu_graphs test_gpu_runtime test_gpu_decoder test_gpu_batch test_gpu_arch"
UNIT_TESTS="test_cuda_fallback"
STAGE_TESTS=${QTTS_STAGE_TESTS:-"$GPU_TESTS $UNIT_TESTS"}

build() {
    cmake -S "$ROOT" -B "$BUILD" -DQTTS_CUDA=ON -DQTTS_CUDA_ARCHS=${QTTS_GPU_ARCHS:-90} -DCMAKE_BUILD_TYPE=Release -DQTTS_WERROR=ON >/dev/null
    # shellcheck disable=SC2086
    cmake --build "$BUILD" --target qtts_cli qtts_kernel_lab $STAGE_TESTS -j2
    rm -rf "$DIST"
    local stage=$BUILD/dist-stage
    rm -rf "$stage"
    mkdir -p "$stage/bin" "$stage/lib" "$stage/ref/models" "$stage/ref/golden" "$DIST"
    cp "$BUILD/qtts" "$BUILD/apps/kernel-lab/qtts-kernel-lab" "$stage/bin/"
    if [ -n "${QTTS_BASELINE_QTTS:-}" ]; then cp "$QTTS_BASELINE_QTTS" "$stage/bin/qtts-baseline"; fi
    for t in $STAGE_TESTS; do cp "$BUILD/tests/$t" "$stage/bin/"; done
    # The voice-assistant example against the C library (issue 19): libqtts.so from the build,
    # found next to the binary on the device (rpath $ORIGIN/../lib).
    cmake --build "$BUILD" --target qtts_shared -j2 >/dev/null
    cp -L "$BUILD/libqtts.so.0" "$stage/lib/"
    mkdir -p "$BUILD/dist-include/qtts"
    cp "$ROOT/engine/api/qtts_c.h" "$BUILD/dist-include/qtts/"  # the installed layout: <qtts/qtts_c.h>
    cc -std=c11 -O2 "$ROOT/apps/examples/assistant.c" -I"$BUILD/dist-include" -L"$stage/lib" -l:libqtts.so.0 -pthread \
        -Wl,-rpath,'$ORIGIN/../lib' -o "$stage/bin/qtts-assistant"
    cp "$ROOT/apps/examples/assistant-tokens.txt" "$stage/ref/"
    strip --strip-unneeded "$stage"/bin/* || true
    # Shared libraries that are not part of glibc, the C++ runtime or CUDA (the GPU machine has
    # those): PortAudio, Opus, spdlog/fmt, OpenBLAS, ...
    for b in "$stage"/bin/*; do
        ldd "$b" | awk '/=> \// {print $3}'
    done | sort -u | while read -r lib; do
        case "$(basename "$lib")" in
            libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libstdc++.so*|libgcc_s.so*|ld-linux*) ;;
            libcuda.so*|libcudart.so*|libcublas.so*|libcublasLt.so*) ;;
            libqtts.so*) ;;  # staged above
            *) cp -L "$lib" "$stage/lib/" ;;
        esac
    done
    # The tiny reference models the GPU-vs-CPU tests use (vocab/merges are not needed by the LM).
    local ref=${QTTS_REFERENCE_DIR:-$ROOT/../shared/reference}
    if [ -d "$ref/models" ]; then
        for m in tiny-customvoice tiny-voicedesign tiny-base; do
            [ -d "$ref/models/$m" ] || continue
            mkdir -p "$stage/ref/models/$m/speech_tokenizer"
            cp "$ref/models/$m/config.json" "$ref/models/$m/generation_config.json" "$ref/models/$m/model.safetensors" \
                "$stage/ref/models/$m/"
            cp "$ref/models/$m/speech_tokenizer/config.json" "$stage/ref/models/$m/speech_tokenizer/"
        done
        # The runtime test loads a complete model (SpeechModel: text tokenizer too); tiny-base
        # (the Base voice case, ~10 MB compressed) shares the same tokenizer files, linked on the device.
        cp "$ref/models/tiny-customvoice/"{vocab.json,merges.txt,tokenizer_config.json} "$stage/ref/models/tiny-customvoice/"
        # One copy of the (shared) speech tokenizer weights; linked into both models on the device.
        cp "$ref/models/tiny-customvoice/speech_tokenizer/model.safetensors" "$stage/ref/speech_tokenizer.safetensors"
        cp "$ref/golden/scenarios.json" "$stage/ref/golden/"
        # The long decoder scenario (3 MB) for test_gpu_decoder's golden cases.
        cp "$ref/golden/tiny-customvoice--decoder_long.safetensors" "$stage/ref/golden/"
    fi
    # The commit the binaries were built from (the device's copy of the tree may not carry .git).
    git -C "$ROOT" describe --always --dirty --abbrev=7 >"$stage/ref/commit.txt" 2>/dev/null || echo '?' >"$stage/ref/commit.txt"
    tar -C "$stage" -cf - bin lib ref | xz -T2 -9 >"$DIST/payload.tar.xz"  # -9: the payload and the tree must stay under the 64 MiB carry limit
    rm -rf "$stage"
    ls -la "$DIST"
    echo "staged: $(du -sh "$DIST" | cut -f1) in $DIST (carry build-gpu/dist)"
}

# Nsight Compute on the GPU machine (empty when absent), and the flags of a kernel-time profile:
# every kernel of the profiled window alone, its GPU time only, as CSV.
ncu_find() { command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1 || true; }
NCU_TIME_FLAGS=(--profile-from-start off --clock-control none --cache-control none --metrics gpu__time_duration.sum
                --csv --print-units base --print-kernel-base function)

device() {
    local out=${OUT:-/tmp/qtts-out}
    local q=/tmp/qtts-gpu
    mkdir -p "$out" "$q"
    local summary=$out/summary.txt
    : >"$summary"
    note() { echo "$*" | tee -a "$summary"; }

    local t0=$SECONDS
    if command -v xz >/dev/null; then
        xz -dc "$DIST/payload.tar.xz" | tar -C "$q" -xf -
    else
        python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" \
            "$DIST/payload.tar.xz" "$q"
    fi
    for m in tiny-customvoice tiny-voicedesign tiny-base; do
        [ -d "$q/ref/models/$m" ] && ln -sf "$q/ref/speech_tokenizer.safetensors" "$q/ref/models/$m/speech_tokenizer/model.safetensors"
    done
    if [ -d "$q/ref/models/tiny-base" ]; then
        for f in vocab.json merges.txt tokenizer_config.json; do
            ln -sf "$q/ref/models/tiny-customvoice/$f" "$q/ref/models/tiny-base/$f"
        done
    fi
    export LD_LIBRARY_PATH=$q/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
    export QTTS_REFERENCE_DIR=$q/ref
    export QTTS_LOG_LEVEL=${QTTS_LOG_LEVEL:-info}
    # At most a few files come back from the device: summary.txt, tests.log, bench.log, bench-*.json.
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee -a "$summary"
    note "unpacked in $((SECONDS - t0)) s; binaries built from commit $(cat "$q/ref/commit.txt" 2>/dev/null || echo '?')"

    local failed=0
    run_test() {  # name label [env...]
        local name=$1 label=$2
        shift 2
        local t=$SECONDS rc=0
        echo "===== $name" >>"$out/tests.log"
        timeout "${QTTS_TEST_TIMEOUT:-180}" env QTTS_TEST_LABEL="$label" "$@" "$q/bin/$name" --durations yes >"$q/$name.log" 2>&1 || rc=$?
        cat "$q/$name.log" >>"$out/tests.log"
        note "$(printf '%-22s rc=%-3s %4ss  %s' "$name" "$rc" "$((SECONDS - t))" "$(tail -n 1 "$q/$name.log")")"
        [ "$rc" -eq 0 ] || failed=1
    }
    for t in $UNIT_TESTS; do [ -x "$q/bin/$t" ] && run_test "$t" unit; done
    [ -x "$q/bin/test_gpu_kernels" ] && run_test test_gpu_kernels gpu
    [ -x "$q/bin/test_gpu_lm" ] && run_test test_gpu_lm gpu
    [ -x "$q/bin/test_gpu_decoder" ] && run_test test_gpu_decoder gpu QTTS_TEST_DECODER_FRAMES=100
    [ -x "$q/bin/test_gpu_batch" ] && run_test test_gpu_batch gpu
    [ -x "$q/bin/test_gpu_arch" ] && run_test test_gpu_arch gpu
    "$q/bin/qtts" version 2>&1 | tee -a "$summary" || note "qtts version FAILED"

    # The voice-assistant example on the GPU (issue 19): demo model, CUDA backend, a virtual player
    # (20 ms periods); it prints first audio from the first token and cancel-to-silence (barge-in).
    if [ -x "$q/bin/qtts-assistant" ] && [ "${QTTS_ASSISTANT:-1}" = "1" ]; then
        local t=$SECONDS
        QTTS_CACHE_DIR=/tmp/qtts-cache timeout 120 "$q/bin/qtts-assistant" --backend cuda --token-ms 5 --period-ms 20 \
            --max-frames 40 --min-speech-ms 200 --min-queued-ms 300 "$q/ref/assistant-tokens.txt" >"$q/assistant.log" 2>&1 \
            || note "assistant example FAILED"
        { echo "===== assistant example (cuda)"; cat "$q/assistant.log"; } >>"$out/tests.log"
        grep -iE "first audio|silence|barge|cancel" "$q/assistant.log" | sed 's/^/  [assistant] /' | tee -a "$summary" || true
        note "assistant example: $((SECONDS - t)) s"
    fi

    local presets=${QTTS_BENCH_PRESETS:-"1.7b-customvoice 0.6b-customvoice"}
    local frames=${QTTS_BENCH_FRAMES:-256}
    for p in $presets; do
        local dir=/tmp/qtts-models/$p t=$SECONDS
        "$q/bin/qtts" make-model --preset "$p" --out "$dir" >>"$out/bench.log" 2>&1
        note "make-model $p: $((SECONDS - t)) s"
        if [ "$p" = "1.7b-customvoice" ] && [ -x "$q/bin/test_gpu_graphs" ]; then
            run_test test_gpu_graphs gpu QTTS_TEST_MODEL_DIR="$dir"
        fi
        if [ "$p" = "1.7b-customvoice" ] && [ -x "$q/bin/test_gpu_runtime" ]; then
            run_test test_gpu_runtime gpu QTTS_TEST_MODEL_DIR="$dir"
        fi
        if [ "$p" = "1.7b-customvoice" ] && [ -x "$q/bin/test_gpu_batch" ]; then
            run_test test_gpu_batch gpu QTTS_TEST_MODEL_DIR="$dir"
        fi
        # The serving benchmark (QTTS_BENCH_SERVE="1,4,10,16,32,64": closed-loop concurrency levels,
        # batched and, up to QTTS_BENCH_SERVE_OFF, unbatched; QTTS_BENCH_SERVE_RATE: paced arrivals/s,
        # with 96 stream slots: Poisson bursts at 30 requests/s fill 64 at times, docs/performance.md;
        # QTTS_BENCH_SERVE_ARGS: more closed-loop options, e.g. --trace).
        if [ -n "${QTTS_BENCH_SERVE:-}" ] && [ "$p" = "1.7b-customvoice" ]; then
            t=$SECONDS
            local serve="$q/bin/qtts bench-serve --model $dir --backend cuda --frames 75"
            { timeout 300 $serve --concurrency "$QTTS_BENCH_SERVE" ${QTTS_BENCH_SERVE_ARGS:-} --json "$out/serve-$p.json" 2>&1 || note "bench-serve FAILED";
              [ -n "${QTTS_BENCH_SERVE_OFF:-}" ] && { timeout 300 $serve --no-batching --concurrency "$QTTS_BENCH_SERVE_OFF" \
                  --json "$out/serve-$p-nobatch.json" 2>&1 || note "bench-serve --no-batching FAILED"; }
              [ -n "${QTTS_BENCH_SERVE_RATE:-}" ] && { timeout 200 $serve --paced --rate "$QTTS_BENCH_SERVE_RATE" --duration 10 \
                  --max-streams 96 --json "$out/serve-$p-paced.json" 2>&1 || note "bench-serve --paced FAILED"; }
            } >"$q/serve.log"
            grep -vE '^\[' "$q/serve.log" | tee -a "$summary" >/dev/null
            cat "$q/serve.log" >>"$out/bench.log"
            note "bench-serve $p: $((SECONDS - t)) s"
        fi
        # The same benchmarks on the same weights with the real checkpoints' text tokenizer (the staged
        # reference model's vocab.json / merges.txt; QTTS_BENCH_REAL_TOKENIZER=1, off when empty): the
        # demo tokenizer is byte-level, so a 20-word sentence is ~110 prompt tokens instead of ~25.
        if [ -n "${QTTS_BENCH_REAL_TOKENIZER:-}" ] && [ "$p" = "1.7b-customvoice" ] && [ -f "$q/ref/models/tiny-customvoice/vocab.json" ]; then
            t=$SECONDS
            local real=/tmp/qtts-models/$p-real-tokenizer
            "$q/bin/qtts" make-model --preset "$p" --out "$real" --tokenizer-from "$q/ref/models/tiny-customvoice" >>"$out/bench.log" 2>&1
            if [ -n "${QTTS_BENCH_SERVE:-}" ]; then
                timeout 300 "$q/bin/qtts" bench-serve --model "$real" --backend cuda --frames 75 --concurrency "$QTTS_BENCH_SERVE" ${QTTS_BENCH_SERVE_ARGS:-} \
                    --json "$out/serve-$p-real-tokenizer.json" >"$q/serve-real.log" 2>&1 || note "bench-serve (real tokenizer) FAILED"
                grep -vE '^\[' "$q/serve-real.log" | sed "s/^/  [real tokenizer] /" | tee -a "$summary" >/dev/null
                cat "$q/serve-real.log" >>"$out/bench.log"
            fi
            timeout "${QTTS_BENCH_TIMEOUT:-240}" "$q/bin/qtts" bench --model "$real" --frames "$frames" \
                --json "$out/bench-$p-real-tokenizer.json" >"$q/bench-real.log" 2>&1 || note "bench (real tokenizer) FAILED"
            cat "$q/bench-real.log" >>"$out/bench.log"
            grep -E '^\s+(time to first|first chunk|generator|e2e)' "$q/bench-real.log" | sed "s/^/  [real tokenizer] /" | tee -a "$summary" || true
            rm -rf "$real"
            note "real-tokenizer benchmarks: $((SECONDS - t)) s"
        fi
        # A spoken sentence under GPU memory caps (QTTS_MEMORY_LIMITS="6G 3G", off when empty;
        # needs `--gpu-memory-limit`, issue 23's branch wt-arch): peak memory, first audio and
        # real-time factor from `qtts say`'s log.
        for lim in ${QTTS_MEMORY_LIMITS:-}; do
            "$q/bin/qtts" say "The quick brown fox jumps over the lazy dog, and then it runs away." --model "$dir" \
                --backend cuda --greedy --max-frames 150 --gpu-memory-limit "$lim" -o "$q/say-$p-$lim.wav" \
                >"$q/say-$p-$lim.log" 2>&1 || note "say $p under $lim: failed (rc $?)"
            cat "$q/say-$p-$lim.log" >>"$out/bench.log"
            grep -iE "peak GPU memory|first audio|real-time|context|slot|room|rror" "$q/say-$p-$lim.log" \
                | sed "s/^/  [$p say $lim] /" | tee -a "$summary" || true
        done
        # Batched speech-decoder passes (QTTS_BENCH_DECODER_STREAMS="2,8,32,64", off when empty;
        # release-size random tokenizer, chunks of 1 and 4 frames).
        if [ -n "${QTTS_BENCH_DECODER_STREAMS:-}" ] && [ "$p" = "1.7b-customvoice" ]; then
            t=$SECONDS
            timeout "${QTTS_BENCH_TIMEOUT:-240}" "$q/bin/qtts" bench-decoder --chunks 1,4 --frames 64 --repeats 2 \
                --streams "$QTTS_BENCH_DECODER_STREAMS" ${QTTS_BENCH_DECODER_ARGS:-} --cache "$q/decoder-model" \
                --json "$out/bench-decoder-batched.json" >"$q/bench-decoder.log" 2>&1 || note "decoder bench FAILED"
            cat "$q/bench-decoder.log" >>"$out/bench.log"
            note "decoder bench: $((SECONDS - t)) s"
            grep -E '^\s+batched' "$q/bench-decoder.log" | sed "s/^/  [decoder] /" | tee -a "$summary" || true
        fi
        # One batched decoder pass per stream count under Nsight Compute (QTTS_PROFILE_DECODER="32,64",
        # off when empty; chunks of 4): every kernel's GPU time alone, summed per kernel by
        # tools/ncu_kernels.py.
        if [ -n "${QTTS_PROFILE_DECODER:-}" ] && [ "$p" = "1.7b-customvoice" ]; then
            t=$SECONDS
            local ncu_dec
            ncu_dec=$(ncu_find)
            if [ -n "$ncu_dec" ]; then
                for s in ${QTTS_PROFILE_DECODER//,/ }; do
                    timeout 300 "$ncu_dec" "${NCU_TIME_FLAGS[@]}" --log-file "$q/ncu-decoder-$s.csv" \
                        "$q/bin/qtts" bench-decoder --chunks 4 --frames 16 --repeats 1 --streams "$s" --profile \
                        --cache "$q/decoder-model" >"$q/ncu-decoder-$s.log" 2>&1 \
                        || note "ncu decoder profile $s FAILED (rc $?)"
                    cp "$q/ncu-decoder-$s.csv" "$out/" 2>/dev/null || true
                    echo "  [decoder profile $s x 4]" | tee -a "$summary"
                    python3 "$ROOT/tools/ncu_kernels.py" "$q/ncu-decoder-$s.csv" 25 2>&1 | tee -a "$summary" \
                        || note "ncu_kernels.py FAILED"
                done
            else
                note "ncu not found: no decoder profile"
            fi
            note "decoder profile: $((SECONDS - t)) s"
        fi
        # The batched frame step per bucket (QTTS_BENCH_BATCH="1,2,4,...", off when empty;
        # QTTS_BENCH_BATCH_ARGS e.g. "--batch-paths auto,sk16 --batch-step-only").
        if [ -n "${QTTS_BENCH_BATCH:-}" ]; then
            t=$SECONDS
            timeout "${QTTS_BENCH_TIMEOUT:-240}" "$q/bin/qtts" bench --model "$dir" --batch "$QTTS_BENCH_BATCH" \
                --frames "${QTTS_BENCH_BATCH_FRAMES:-64}" --chunk 4 ${QTTS_BENCH_BATCH_ARGS:-} --json "$out/bench-$p-batch.json" \
                >"$q/bench-$p-batch.log" 2>&1 || { note "batch bench $p FAILED"; failed=1; }
            cat "$q/bench-$p-batch.log" >>"$out/bench.log"
            note "batch bench $p: $((SECONDS - t)) s"
            grep -E '^\s+[0-9]+\s+(gemv|split|auto|sk16|sk32|t1|unfused)' "$q/bench-$p-batch.log" | sed "s/^/  [$p batch] /" | tee -a "$summary" || true
            sed -n '/prompt prefills/,$p' "$q/bench-$p-batch.log" | sed "s/^/  [$p prefill] /" | tee -a "$summary" || true
        fi
        # One replay of the batched step per bucket under Nsight Compute (QTTS_PROFILE_BATCH="12,64",
        # off when empty): every kernel's GPU time, alone (ncu serialises them: no PDL overlap), summed
        # per kernel by tools/ncu_step.py. QTTS_PROFILE_PATHS: the product paths (default auto).
        if [ -n "${QTTS_PROFILE_BATCH:-}" ] && [ "$p" = "1.7b-customvoice" ]; then
            t=$SECONDS
            local ncu
            ncu=$(ncu_find)
            if [ -n "$ncu" ]; then
                timeout 300 "$ncu" "${NCU_TIME_FLAGS[@]}" --log-file "$q/ncu-batch.csv" \
                    "$q/bin/qtts" bench --model "$dir" --batch "$QTTS_PROFILE_BATCH" \
                    --frames 8 --chunk 1 --batch-paths "${QTTS_PROFILE_PATHS:-auto}" --batch-step-only --batch-profile \
                    >"$q/ncu-bench.log" 2>&1 || note "ncu profile FAILED (rc $?)"
                cp "$q/ncu-batch.csv" "$out/" 2>/dev/null || true
                python3 "$ROOT/tools/ncu_step.py" "$q/ncu-batch.csv" 2>&1 | tee -a "$summary" || note "ncu_step.py FAILED"
            else
                note "ncu not found: no profile"
            fi
            note "batch profile: $((SECONDS - t)) s"
        fi
        # The kernel lab (apps/kernel-lab): GEMV variants checked and timed, per-kernel frame timing.
        # QTTS_KERNEL_LAB: the lab modes to run, comma-separated (gemv, frame, gemm, wide, rows, persist, attno, parts,
        # stream); 1 = gemv
        # and frame, 0 = none. QTTS_KERNEL_LAB_ROWS: the gemm, wide and rows modes' row counts.
        local lab_modes=${QTTS_KERNEL_LAB:-1}
        [ "$lab_modes" = "1" ] && lab_modes=gemv,frame
        [ "$lab_modes" = "0" ] && lab_modes=
        if [ "$p" = "1.7b-customvoice" ] && [ -x "$q/bin/qtts-kernel-lab" ] && [ -n "$lab_modes" ]; then
            t=$SECONDS
            echo "===== kernel lab ($lab_modes)" >"$q/lab.log"
            for m in ${lab_modes//,/ }; do
                case $m in
                    gemv | stream) timeout 120 "$q/bin/qtts-kernel-lab" "$m" >>"$q/lab.log" 2>&1 || note "kernel lab $m FAILED" ;;
                    frame) timeout 120 "$q/bin/qtts-kernel-lab" frame --model "$dir" >>"$q/lab.log" 2>&1 || note "kernel lab frame FAILED" ;;
                    persist | attno | parts) timeout 120 "$q/bin/qtts-kernel-lab" "$m" --model "$dir" >>"$q/lab.log" 2>&1 || note "kernel lab $m FAILED" ;;
                    gemm | wide | rows) timeout 300 "$q/bin/qtts-kernel-lab" "$m" --model "$dir" --rows "${QTTS_KERNEL_LAB_ROWS:-24,32,48,64}" \
                              >>"$q/lab.log" 2>&1 || note "kernel lab $m FAILED" ;;
                    *) note "kernel lab: unknown mode '$m'" ;;
                esac
            done
            cat "$q/lab.log" >>"$out/bench.log"
            note "kernel lab: $((SECONDS - t)) s"
        fi
        if [ -x "$q/bin/qtts-baseline" ]; then
            t=$SECONDS
            timeout "${QTTS_BENCH_TIMEOUT:-240}" "$q/bin/qtts-baseline" bench --model "$dir" --frames "$frames" ${QTTS_BENCH_ARGS:-} \
                --json "$out/bench-$p-baseline.json" >"$q/bench-$p-baseline.log" 2>&1 || note "baseline bench $p FAILED"
            { echo "===== baseline"; cat "$q/bench-$p-baseline.log"; } >>"$out/bench.log"
            note "baseline bench $p: $((SECONDS - t)) s"
            grep -E '^\s+(time to first|end to end|frame,|real-time)' "$q/bench-$p-baseline.log" | sed "s/^/  [$p baseline] /" | tee -a "$summary" || true
        fi
        t=$SECONDS
        timeout "${QTTS_BENCH_TIMEOUT:-240}" "$q/bin/qtts" bench --model "$dir" --frames "$frames" ${QTTS_BENCH_ARGS:-} \
            --json "$out/bench-$p.json" >"$q/bench-$p.log" 2>&1 || { note "bench $p FAILED"; failed=1; }
        cat "$q/bench-$p.log" >>"$out/bench.log"
        note "bench $p: $((SECONDS - t)) s"
        grep -E '^\s+(prefill|time to first|end to end|e2e|prepare|utterance|first chunk|generator|overlap|frame,|  talker|  predictor|launches|bytes per|bandwidth|achieved|real-time|talker |predictor |codec|rmsnorm|frame embed|sample)' \
            "$q/bench-$p.log" | sed "s/^/  [$p] /" | tee -a "$summary" || true
        rm -rf "$dir"
    done
    note "total $((SECONDS - t0)) s, failed=$failed"
    return $failed
}

case "${1:-}" in
    build) build ;;
    device) device ;;
    *)
        echo "usage: tools/gpu-run.sh build|device" >&2
        exit 2
        ;;
esac
