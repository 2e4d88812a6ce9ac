"""Build the small tokenizer that `make gpu-smoke` ships (gpu/tokenizer/): a byte-level BPE with 1024 tokens,
trained on this repository's README.md and grpo.py, plus a ChatML chat template with Qwen3's thinking switch.

    python gpu/make_tokenizer.py     # rewrites gpu/tokenizer/ (run once; the files are committed)

Byte-level, so any string encodes (the paper scripts' prompts too). A prepare-style script: the smoke test and
the tests only read what it wrote.
"""
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

HERE = Path(__file__).resolve().parent
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
# ChatML as Qwen3 writes it: enable_thinking=False opens the reply with an empty think block
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n"
                 "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
                 "{% endif %}")


def main():
    corpus = [(HERE.parent / f).read_text() for f in ("README.md", "grpo.py")]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1024, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(corpus, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  bos_token="<|endoftext|>")
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(HERE / "tokenizer")
    print(f"{len(tok)} tokens → {HERE / 'tokenizer'}")


if __name__ == "__main__":
    main()
