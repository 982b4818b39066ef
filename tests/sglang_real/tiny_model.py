"""Make a tiny random-weight Llama for the real-SGLang tier, offline: a WordLevel tokenizer over the
builtin client's words plus filler tokens (vocab 1024), hidden 256, 2 layers, saved with save_pretrained.

Run with the SGLang venv's interpreter (it has transformers and tokenizers):
    .venv-sglang/bin/python tests/sglang_real/tiny_model.py OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

VOCAB = 1024
# The words bench.py's prompts are made of (orchestrator/trial/bench.py::_WORDS), so a prompt of n words is n tokens.
WORDS = (
    "the quick brown fox jumps over a lazy dog while engineers tune collective communication "
    "for speculative decoding on eight accelerators connected by a slow bus"
).split()


def make(out: Path) -> Path:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    words = list(dict.fromkeys(WORDS))
    vocab = {t: i for i, t in enumerate(specials + words)}
    for i in range(len(vocab), VOCAB):
        vocab[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        torch_dtype="bfloat16",
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    fast.save_pretrained(out)
    return out


if __name__ == "__main__":
    print(make(Path(sys.argv[1])))
