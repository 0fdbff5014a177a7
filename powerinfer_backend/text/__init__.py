"""Layer 6 (with ``llama.py``), ``text``: llama.cpp's tokenizer and sampler chain, through
llama-cpp-python, over our logits."""
