"""What an engine imports, imported once in the forkserver that `engine_fork` forks engines from
(torch and transformers' Llama and tokenizer code: most of an engine's start-up CPU)."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch: a forked child must not inherit a thread pool
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: F401
import transformers.models.llama.modeling_llama  # noqa: F401
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401

import rollflow.cli
import rollflow.runtime.engines.builtin.launch
import rollflow.runtime.engines.builtin.server
import rollflow.runtime.engines.builtin.worker  # noqa: F401
