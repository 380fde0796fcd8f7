#!/usr/bin/env python3
"""Writes the seed corpora of tests/fuzz/corpus/<target>/: a few small valid inputs and edge cases
per target, made from scratch (no reference files). Run from the repository root; the output is
committed, so this only needs running again when the seeds change. Findings of fuzz runs are
added to the corpora by hand (tests/fuzz/corpus/<target>/crash-*), not by this script."""
import json
import math
import os
import struct
import wave
import io

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# --- safetensors -------------------------------------------------------------------------------
def safetensors(tensors, metadata=None, pad=True, header_override=None):
    header, blob = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(raw)]}
        blob += raw
    if metadata:
        header["__metadata__"] = metadata
    text = header_override if header_override is not None else json.dumps(header)
    while pad and (len(text) + 8) % 8:
        text += " "
    return struct.pack("<Q", len(text)) + text.encode() + blob


f32 = struct.pack("<6f", 0.5, -1.0, 2.0, 3.5, 0.0, -0.25)
put("fuzz_safetensors", "valid_f32", safetensors({"w": ("F32", [2, 3], f32)}, {"format": "pt"}))
put("fuzz_safetensors", "valid_mixed", safetensors({
    "a.bf16": ("BF16", [4], struct.pack("<4H", 0x3F80, 0xBF80, 0x7FC0, 0x0001)),
    "b.f16": ("F16", [2, 2], struct.pack("<4H", 0x3C00, 0x8001, 0x7C00, 0x0400)),
    "c.i64": ("I64", [2], struct.pack("<2q", -5, 1 << 40)),
    "d.i32": ("I32", [1], struct.pack("<i", 7)),
    "e.u8": ("U8", [3], b"\x00\x7f\xff"),
    "f.empty": ("F32", [0, 4], b""),
}, {"format": "pt", "qtts_preset": "seed"}))
put("fuzz_safetensors", "empty_header", safetensors({}))
put("fuzz_safetensors", "scalar", safetensors({"s": ("F32", [], struct.pack("<f", 1.5))}))
put("fuzz_safetensors", "truncated", safetensors({"w": ("F32", [2, 3], f32)})[:-5])
put("fuzz_safetensors", "overlap", safetensors({}, header_override=json.dumps({
    "a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
    "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}})) + b"12345678")
put("fuzz_safetensors", "huge_length", struct.pack("<Q", 1 << 63) + b"{}")

# --- config --------------------------------------------------------------------------------------
transformer = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
               "max_position_embeddings": 4096, "hidden_act": "silu", "attention_bias": False}
talker = dict(transformer, vocab_size=3072, text_vocab_size=151936, text_hidden_size=64, num_code_groups=16,
              codec_eos_token_id=2150, rope_scaling={"mrope_section": [2, 3, 3], "interleaved": True},
              spk_id={"Alice": 3000, "Bob": [3001]}, spk_is_dialect={"Alice": False, "Bob": "north"},
              codec_language_id={"english": 2050, "north": 2051},
              code_predictor_config=dict(transformer, vocab_size=2048, num_code_groups=16))
model = {"tts_model_type": "custom_voice", "tts_model_size": "0b6", "talker_config": talker}
put("fuzz_config", "model_custom_voice", b"\x00" + json.dumps(model).encode())
base = dict(model, tts_model_type="base", speaker_encoder_config={
    "mel_dim": 128, "enc_dim": 64, "enc_channels": [32, 32, 32, 32, 96], "enc_kernel_sizes": [5, 3, 3, 3, 1],
    "enc_dilations": [1, 2, 3, 4, 1], "enc_res2net_scale": 4, "sample_rate": 24000})
put("fuzz_config", "model_base", b"\x03" + json.dumps(base).encode())
put("fuzz_config", "model_bad_type", b"\x00" + json.dumps(dict(model, tts_model_type="other")).encode())
speech = {"encoder_valid_num_quantizers": 16, "input_sample_rate": 24000, "output_sample_rate": 24000,
          "decode_upsample_rate": 1920, "encode_downsample_rate": 1920,
          "decoder_config": {"codebook_size": 2048, "codebook_dim": 32, "latent_dim": 48, "decoder_dim": 96,
                             "hidden_size": 32, "intermediate_size": 64, "head_dim": 16, "num_attention_heads": 2,
                             "num_hidden_layers": 2, "sliding_window": 72, "num_quantizers": 16,
                             "num_semantic_quantizers": 1, "upsample_rates": [8, 5, 4, 3],
                             "upsampling_ratios": [2, 2]},
          "encoder_config": {"num_filters": 8, "upsampling_ratios": [8, 6, 5, 4], "hidden_size": 32,
                             "num_hidden_layers": 1, "num_attention_heads": 2, "codebook_dim": 16}}
put("fuzz_config", "speech_tokenizer", b"\x01" + json.dumps(speech).encode())
put("fuzz_config", "generation", b"\x02" + json.dumps({
    "do_sample": True, "repetition_penalty": 1.05, "temperature": 0.9, "top_p": 1.0, "top_k": 50,
    "subtalker_dosample": True, "subtalker_temperature": 0.9, "subtalker_top_p": 1.0, "subtalker_top_k": 50,
    "max_new_tokens": 8192}).encode())
put("fuzz_config", "generation_big_numbers", b"\x02" + b'{"top_k": 1e300, "max_new_tokens": 18446744073709551615}')
put("fuzz_config", "not_object", b"\x01[1, 2, 3]")

# --- tokenizer -----------------------------------------------------------------------------------
for name, text in [("english", "Hello, world! It's 3:45 pm -- isn't it?\n"),
                   ("chinese", "你好，世界。今天天气很好！"),
                   ("mixed_scripts", "Café naïve Ångström ﬁ 🙂👍🏽 한국어 日本語 ١٢٣"),
                   ("special_tokens", "<|im_start|>assistant\nhi<|im_end|>\n<tts_pad><think></think>"),
                   ("whitespace", " \t\n\r\n   a  b\u00a0c\u3000d   "),
                   ("combining", "e\u0301 a\u0308\u0304 \u1100\u1161\u11a8"),
                   ("partial_special", "<|im_sta <|im_end| |> <tts_")]:
    put("fuzz_tokenizer", name, text)
put("fuzz_tokenizer", "invalid_utf8", b"ab\xff\xc0\xaf\xed\xa0\x80\xf4\x90\x80\x80\xe4\xbd")

# --- audio files ---------------------------------------------------------------------------------
def wav(rate, channels, width, frames):
    buf = io.BytesIO()
    w = wave.open(buf, "wb")
    w.setnchannels(channels)
    w.setsampwidth(width)
    w.setframerate(rate)
    data = bytearray()
    for i in range(frames):
        v = math.sin(i * 0.3)
        for _ in range(channels):
            if width == 1:
                data += bytes([int(128 + 100 * v)])
            elif width == 2:
                data += struct.pack("<h", int(20000 * v))
            else:
                data += struct.pack("<i", int(2e9 * v))[:width] if width == 3 else struct.pack("<i", int(2e9 * v))
    w.writeframes(bytes(data))
    w.close()
    return buf.getvalue()


def wav_float(rate, samples):
    data = b"".join(struct.pack("<f", s) for s in samples)
    fmt = struct.pack("<HHIIHH", 3, 1, rate, rate * 4, 4, 32)
    return b"RIFF" + struct.pack("<I", 4 + 8 + len(fmt) + 8 + len(data)) + b"WAVE" + b"fmt " + \
        struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data


put("fuzz_audio_file", "pcm16_mono_24k.wav", wav(24000, 1, 2, 200))
put("fuzz_audio_file", "pcm8_stereo_8k.wav", wav(8000, 2, 1, 100))
put("fuzz_audio_file", "pcm24_mono_44k.wav", wav(44100, 1, 3, 120))
put("fuzz_audio_file", "float_16k.wav", wav_float(16000, [0.0, 0.5, -0.5, 1.0]))
put("fuzz_audio_file", "float_nan.wav", wav_float(16000, [0.0, float("nan"), 0.5]))
put("fuzz_audio_file", "truncated.wav", wav(24000, 1, 2, 200)[:120])
put("fuzz_audio_file", "header_only.wav", wav(24000, 1, 2, 0))
put("fuzz_audio_file", "not_audio.txt", "this is not audio\n")

# --- voice files ---------------------------------------------------------------------------------
def fnv1a(data):
    h = 1469598103934665603
    for b in data:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def voice(x_vector_only, ref_frames=0, ids=(), text="", dim=8):
    meta = {"format": "qtts-voice", "tts_model_type": "base", "tts_model_size": "0b6", "hidden_size": dim,
            "fingerprint": "0123456789abcdef", "x_vector_only": x_vector_only, "ref_text": text,
            "x_vector_dim": dim, "ref_frames": ref_frames, "code_groups": 16, "ref_ids_count": len(ids)}
    j = json.dumps(meta, separators=(",", ":")).encode()
    body = b"QTTSVOICE\0" + struct.pack("<II", 1, len(j)) + j
    body += b"".join(struct.pack("<f", 0.1 * i) for i in range(dim))
    body += b"".join(struct.pack("<i", (i * 37) % 2048) for i in range(ref_frames * 16))
    body += b"".join(struct.pack("<i", i) for i in ids)
    return body + struct.pack("<Q", fnv1a(body))


# The target drops the first byte; an odd one makes it fix the checksum up.
put("fuzz_voice_file", "xvector_only.qv", b"\x00" + voice(True))
put("fuzz_voice_file", "icl.qv", b"\x00" + voice(False, 3, [151644, 77091, 198, 9707, 151645, 198], "Hello"))
put("fuzz_voice_file", "icl_fixup.qv", b"\x01" + voice(False, 2, [1, 2, 3, 4, 5, 6], "hi"))
put("fuzz_voice_file", "bad_checksum.qv", b"\x00" + voice(True)[:-1] + b"\x00")
put("fuzz_voice_file", "truncated.qv", b"\x01" + voice(True)[:40])

# --- request parsers ------------------------------------------------------------------------------
http = [{"model": "tts-1", "input": "Hello there.", "voice": "vivian", "response_format": "wav"},
        {"input": "Streaming please", "stream": True, "stream_format": "sse", "seed": 42, "language": "English"},
        {"input": "x", "speed": 1.0, "instructions": "calm", "response_format": "pcm"},
        {"input": "  ", "voice": 7, "seed": -1},
        {"input": "a", "seed": 18446744073709551615, "speed": 1.5}]
for i, body in enumerate(http):
    put("fuzz_speech_params", f"http_{i}", b"\x00" + json.dumps(body, ensure_ascii=False).encode())
put("fuzz_speech_params", "http_not_json", b"\x00{\"input\": \"unterminated")
put("fuzz_speech_params", "tcp_text", b"\x01Hello from a plain TCP client")
put("fuzz_speech_params", "tcp_json", b"\x01" + json.dumps({"input": "hi", "voice": "ryan", "seed": 1}).encode())
put("fuzz_speech_params", "tcp_bad_utf8", b"\x01caf\xc3")

ws = [{"type": "start", "format": "ogg", "text": "hi", "end": True},
      {"type": "start", "voice": "Serena", "language": "chinese", "format": "pcm", "seed": 3},
      {"type": "start", "format": "opus", "instructions": "whisper"},
      {"type": "append", "text": "more text "},
      {"type": "end", "text": "last words."},
      {"type": "end"},
      {"type": "cancel"},
      {"type": "start", "format": "mp3", "end": "yes"},
      {"type": 5}]
for i, msg in enumerate(ws):
    put("fuzz_ws_message", f"msg_{i}", json.dumps(msg, ensure_ascii=False))
put("fuzz_ws_message", "not_json", "start hi")


# --- a FLAC header that announces the longest accepted audio (an hour at 768 kHz) ------------------
def flac_header(rate, channels, bits, total):
    packed = (rate << 44) | ((channels - 1) << 41) | ((bits - 1) << 36) | total
    info = struct.pack(">HH", 4096, 4096) + b"\0" * 6 + packed.to_bytes(8, "big") + b"\0" * 16
    return b"fLaC" + bytes([0x80]) + len(info).to_bytes(3, "big") + info


put("fuzz_audio_file", "flac_hour_768k_no_frames.flac", flac_header(768000, 1, 16, 3600 * 768000 - 1))
put("fuzz_audio_file", "flac_short_no_frames.flac", flac_header(24000, 2, 16, 1000))
