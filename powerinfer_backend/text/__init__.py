"""The ``text`` layer (above ``engine``, below ``sparsity``, whose calibration and
predictor training tokenize text): llama.cpp's tokenizer and sampler chain through
llama-cpp-python, over our logits (``tokenizer``, ``sampling``), and embedding pooling
(``pooling``)."""
