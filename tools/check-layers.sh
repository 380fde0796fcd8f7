#!/usr/bin/env bash
# Reads every #include "..." of the product sources and fails when one points up the layers
# (docs/architecture.md, "Layers"). Top to bottom:
#
#   apps         apps/                 the qtts program and the kernel lab
#   server       audio_io/server/      HTTP / WebSocket / TCP server
#   audio        audio_io/             audio files, Opus, playback, jitter buffer
#   runtime      engine/runtime/       engine, speech model, utterance, voices
#   cpu_fast     engine/cpu_fast/      the fast CPU backend: packed weights, SIMD products, thread
#                                      pool; builds on the reference (ops, decoder), never on cuda
#   backends     engine/cpu/ engine/cuda/   (the two backends never include each other)
#   generation   engine/generation/    sampling, frame vocabulary, generator/decoder interfaces
#   text         engine/text/          tokenizer, prompt layout, sentence split
#   model        engine/model/         config, safetensors, weights and their preparation
#   common       engine/common/        errors, log, device, lock-free ring
#   api          engine/api/           the public header: requests, streams, constants, errors
#   kernels      kernels/              CUDA kernels (their own CUDA_CHECK; include nothing above)
#
# A file may include its own folder's layer and any layer below it. Two layers on the same rank
# (cpu/cuda, api/kernels) may not include each other. Every quoted include must name a file from
# the repository root ("engine/cpu/ops.h"), the one include root. Tests may include anything.
#
# A second rule keeps builds without CUDA (QTTS_CUDA=OFF, or AUTO on a machine without nvcc)
# compiling: only engine/cuda/, kernels/ and apps/kernel-lab/ are built with CUDA alone, so any
# other file (tests included) that includes a CUDA header (<cuda*>, <cublas*>, "engine/cuda/...",
# "kernels/...") must do so after an `#if`/`#ifdef` on QTTS_HAVE_CUDA.
#
# usage: tools/check-layers.sh [repository root]   (exit 0: clean; 1: violations, listed)
set -euo pipefail
root="${1:-$(cd "$(dirname "$0")/.." && pwd)}"
cd "$root"

# layer name, rank and group of a path ("" when the path is not product code)
layer_of() {
    case "$1" in
        apps/*) echo "apps 11 apps" ;;
        audio_io/server/*) echo "server 10 server" ;;
        audio_io/*) echo "audio 9 audio" ;;
        engine/runtime/*) echo "runtime 8 runtime" ;;
        engine/cpu_fast/*) echo "cpu_fast 7 cpu_fast" ;;
        engine/cpu/*) echo "cpu 6 cpu" ;;
        engine/cuda/*) echo "cuda 6 cuda" ;;
        engine/generation/*) echo "generation 5 generation" ;;
        engine/text/*) echo "text 4 text" ;;
        engine/model/*) echo "model 3 model" ;;
        engine/common/*) echo "common 2 common" ;;
        engine/api/*) echo "api 1 api" ;;
        kernels/*) echo "kernels 1 kernels" ;;
        *) echo "" ;;
    esac
}

violations=0
checked=0
while IFS= read -r file; do
    [[ -f "$file" ]] || continue
    read -r src_layer src_rank src_group <<<"$(layer_of "$file")"
    [[ -z "${src_layer:-}" ]] && continue
    while IFS=: read -r line target; do
        checked=$((checked + 1))
        if [[ ! -f "$target" ]]; then
            # Same-folder includes are allowed only for files next to the includer.
            if [[ -f "$(dirname "$file")/$target" ]]; then
                echo "$file:$line: include \"$target\" is relative; name it from the repository root ($(dirname "$file")/$target)"
            else
                echo "$file:$line: include \"$target\" is not a file of the repository (one include root: the top folder)"
            fi
            violations=$((violations + 1))
            continue
        fi
        read -r dst_layer dst_rank dst_group <<<"$(layer_of "$target")"
        if [[ -z "${dst_layer:-}" ]]; then
            echo "$file:$line: includes \"$target\", which is not product code"
            violations=$((violations + 1))
        elif [[ "$dst_group" == "$src_group" ]]; then
            :
        elif [[ "$src_layer" == "cpu_fast" && "$dst_layer" == "cuda" ]]; then
            echo "$file:$line: cpu_fast includes cuda (\"$target\"); the CPU backends never include the CUDA one"
            violations=$((violations + 1))
        elif ((dst_rank >= src_rank)); then
            echo "$file:$line: $src_layer includes $dst_layer (\"$target\"), which is not below it"
            violations=$((violations + 1))
        fi
    done < <(grep -n -E '^[[:space:]]*#[[:space:]]*include[[:space:]]+"' "$file" |
                 sed -E 's/^([0-9]+):[[:space:]]*#[[:space:]]*include[[:space:]]+"([^"]+)".*/\1:\2/')
done < <(git ls-files --cached --others --exclude-standard -- apps audio_io engine kernels |
             grep -E '\.(h|hpp|cpp|cu|cuh)$')

# The CUDA guard (above): the first CUDA include of a file built without CUDA comes after its
# first QTTS_HAVE_CUDA conditional.
cuda_files=0
cuda_include='^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"](cuda|cublas|engine/cuda/|kernels/)'
while IFS= read -r file; do
    [[ -f "$file" ]] || continue
    first_include=$(grep -n -m 1 -E "$cuda_include" "$file" | cut -d: -f1 || true)
    [[ -z "$first_include" ]] && continue
    cuda_files=$((cuda_files + 1))
    first_guard=$(grep -n -m 1 -E '^[[:space:]]*#[[:space:]]*if.*QTTS_HAVE_CUDA' "$file" | cut -d: -f1 || true)
    if [[ -z "$first_guard" ]] || ((first_guard > first_include)); then
        echo "$file:$first_include: includes a CUDA header outside #ifdef QTTS_HAVE_CUDA; builds without CUDA compile this file"
        violations=$((violations + 1))
    fi
done < <(git ls-files --cached --others --exclude-standard -- apps audio_io engine tests |
             grep -E '\.(h|hpp|cpp)$' | grep -v -E '^(engine/cuda|apps/kernel-lab)/')

if ((violations > 0)); then
    echo "check-layers: $violations include(s) out of $checked point up or outside the layers, or need CUDA unguarded (see docs/architecture.md)"
    exit 1
fi
echo "check-layers: $checked includes, every one points down or within its layer; CUDA headers guarded in the $cuda_files files built without CUDA that include them"
