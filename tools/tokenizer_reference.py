#!/usr/bin/env python3
"""Independent reference for the qtts text tokenizer (a cross-check, not used at run time).

A deliberately plain GPT-2-style byte-level BPE in Python (the `regex` module for \\p{..}
classes, textbook "merge the lowest-ranked pair everywhere" loop), reading the same
vocab.json / merges.txt / tokenizer_config.json as qtts. It reproduces the 31 Hugging Face
cases of ../shared/reference/golden/tokenizer-cases.json, and gives the expected ids of the
mistral-fix regex used in tests/golden/test_tokenizer_golden.cpp (the golden file's
`fix_mistral_regex` entry was recorded with the native regex, see docs/text-frontend.md).

usage:
  tools/tokenizer_reference.py MODEL_DIR --cases ../shared/reference/golden/tokenizer-cases.json
  tools/tokenizer_reference.py MODEL_DIR [--regex qwen2|mistral-fix] "some text"
"""
import argparse
import json
import sys
import unicodedata

import regex

QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
MISTRAL_FIX = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
               r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
               r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def byte_symbols():
    keep = set(range(33, 127)) | set(range(161, 173)) | set(range(174, 256))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


class Reference:
    def __init__(self, model_dir):
        with open(f"{model_dir}/vocab.json", encoding="utf-8") as f:
            self.vocab = json.load(f)
        self.ranks = {}
        with open(f"{model_dir}/merges.txt", encoding="utf-8") as f:
            for line in f.read().split("\n"):
                if not line or line.startswith("#version"):
                    continue
                left, right = line.split(" ")
                self.ranks[(left, right)] = len(self.ranks)
        with open(f"{model_dir}/tokenizer_config.json", encoding="utf-8") as f:
            decoder = json.load(f).get("added_tokens_decoder", {})
        self.added = {v["content"]: int(k) for k, v in decoder.items()}
        self.added_longest_first = sorted(self.added, key=len, reverse=True)
        self.symbols = byte_symbols()

    def bpe(self, word):
        parts = list(word)
        while len(parts) > 1:
            ranked = [(self.ranks.get((parts[i], parts[i + 1])), i) for i in range(len(parts) - 1)]
            ranked = [r for r in ranked if r[0] is not None]
            if not ranked:
                break
            pair = (parts[min(ranked)[1]], parts[min(ranked)[1] + 1])
            merged, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == pair:
                    merged.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        return [self.vocab[p] for p in parts]

    def encode(self, text, pattern):
        ids = []

        def plain(segment):
            for m in regex.finditer(pattern, unicodedata.normalize("NFC", segment)):
                ids.extend(self.bpe("".join(self.symbols[b] for b in m.group(0).encode("utf-8"))))

        i = start = 0
        while i < len(text):
            hit = next((t for t in self.added_longest_first if text.startswith(t, i)), None)
            if hit is None:
                i += 1
                continue
            plain(text[start:i])
            ids.append(self.added[hit])
            i += len(hit)
            start = i
        plain(text[start:])
        return ids


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir")
    parser.add_argument("text", nargs="?")
    parser.add_argument("--cases", help="tokenizer-cases.json to check against")
    parser.add_argument("--regex", choices=["qwen2", "mistral-fix"], default="qwen2")
    args = parser.parse_intermixed_args()
    ref = Reference(args.model_dir)
    pattern = QWEN2 if args.regex == "qwen2" else MISTRAL_FIX
    if args.cases:
        with open(args.cases, encoding="utf-8") as f:
            cases = json.load(f)
        failures = 0
        for i, text in enumerate(cases["texts"]):
            ids = ref.encode(text, QWEN2)
            if ids != cases["default"][i]:
                failures += 1
                print(f"case {i}: MISMATCH {ids} != {cases['default'][i]}")
            fixed = ref.encode(text, MISTRAL_FIX)
            if fixed != ids:
                print(f"case {i} {text!r}: mistral-fix ids {fixed}")
        print(f"{len(cases['texts']) - failures} passed, {failures} failed")
        return 1 if failures else 0
    print(json.dumps({"ids": ref.encode(args.text or "", pattern)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
