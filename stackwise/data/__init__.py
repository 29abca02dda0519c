from stackwise.data.pack import PreparedData, TokenBlocks, build_data, specials_of
from stackwise.data.plain_tokenizer import PlainTokenizer, as_transformers
from stackwise.data.sources import load_documents
from stackwise.data.tokenizer import corpus_tokenizer, load_tokenizer_dir, train_bpe

__all__ = [
    "PlainTokenizer",
    "PreparedData",
    "TokenBlocks",
    "as_transformers",
    "build_data",
    "corpus_tokenizer",
    "load_documents",
    "load_tokenizer_dir",
    "specials_of",
    "train_bpe",
]
