"""The ``text`` layer (above ``engine``, below ``sparsity``, whose calibration and
predictor training tokenize text): the generation loop over our logits (``sequence``:
tokens, KV cells, sampler chain; ``runner``: typed events; ``completion`` / ``chat``:
llama-cpp-python's result shapes) and llama.cpp's leaf components through
llama-cpp-python's public API (``tokenizer``, ``sampling``, ``grammar``), embedding
pooling (``pooling``) and the timing report (``perf``)."""
