"""A scripted model for llama.cpp's server, written as a GGUF file of ~100 KB, and its server.

The model knows two replies. Asked with no tool result in its context, it answers with two
tool calls in one reply, ``get_weather(city="Paris")`` and ``get_time(timezone="Europe/Paris")``,
in the Hermes format its chat template (ChatML, like Qwen 2.5's) shows the server; asked again
with their results, it answers ``Both tools answered.``. The server reads its own tool-call
format off the template, parses the calls out of the text and streams them as
``delta.tool_calls`` fragments, as for any model.

How one llama block (all weights hand-set, most of them zero) does it:

- every token of either reply is a token of its own, so each one's embedding (a class of its
  own) tells which comes next: its row of the output matrix points at the next piece, the last
  piece's at ``<|im_end|>``, the end of the reply;
- the prompt ends with ``<|im_start|>assistant`` and a newline, whose class points at the first
  piece of the tool calls, and (by a little less) at the first piece of the text;
- the attention's queries and keys are zero, so it averages its values over the context; only
  ``<tool_response>``, which the template writes around each tool result, has a value: with a
  result in the context the average tips the newline's choice to the text.

Run as a script, ``python tiny_llamacpp.py MODEL.gguf`` serves the model with xllamacpp's build
of llama.cpp's server on a free loopback port, prints its address and serves until stopped.
"""

from __future__ import annotations

import itertools
import sys
import time

TOOL_CALLS = ["<tool_call>", '\n{"name": "get_weather", ', '"arguments": {"city": ', '"Paris"}}\n',
              "</tool_call>", "\n<tool_call>", '\n{"name": "get_time", ',
              '"arguments": {"timezone": ', '"Europe/Paris"}}\n', "</tool_call>\n"]
TEXT = ["Both", " tools", " answered."]

# ChatML with tools in the Hermes format (Qwen 2.5's template, shortened).
TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
{{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and ' }}
{{- 'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n' }}
{{- '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first)
      or (message.role == 'assistant' and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
{%- for call in message.tool_calls %}
{%- if call.function is defined %}{%- set call = call.function %}{%- endif %}
{{- '\\n<tool_call>\\n{"name": "' + call.name + '", "arguments": ' + (call.arguments | tojson) }}
{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
{{- '<|im_start|>user' }}
{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""

# token types (gguf.TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6


def write_model(path: str) -> None:
    """Write the model, with its vocabulary and chat template, to ``path``."""
    import gguf
    import numpy as np

    special = {"<unk>": UNKNOWN, "<|im_start|>": CONTROL, "<|im_end|>": CONTROL,
               "<tool_response>": USER_DEFINED}
    tokens = [*special, *(f"<0x{byte:02X}>" for byte in range(256)), *TOOL_CALLS, *TEXT]
    types = [*special.values(), *[BYTE] * 256, *[NORMAL] * (len(TOOL_CALLS) + len(TEXT))]
    ids = {token: i for i, token in enumerate(tokens)}
    end, newline, result = ids["<|im_end|>"], ids["<0x0A>"], ids["<tool_response>"]

    # The residual stream's dimensions: OTHER (the tokens whose next one does not matter),
    # RESULT (<tool_response>), SEEN (what the attention brings of it), NEWLINE, then one for
    # each piece of the replies.
    dim, OTHER, RESULT, SEEN, NEWLINE = 32, 0, 1, 2, 3
    embed = np.zeros((len(tokens), dim), np.float32)
    embed[:, OTHER] = 1
    output = np.zeros((len(tokens), dim), np.float32)
    next_piece = 1e6  # far above what SEEN can add to any logit
    for token, dimension in ((result, RESULT), (newline, NEWLINE)):
        embed[token] = 0
        embed[token, dimension] = 1
    chains = [[ids[piece] for piece in reply] + [end] for reply in (TOOL_CALLS, TEXT)]
    pairs = [pair for chain in chains for pair in itertools.pairwise(chain)]
    for dimension, (here, following) in enumerate(pairs, start=4):
        embed[here] = 0
        embed[here, dimension] = 1
        output[following, dimension] = next_piece
    # After the newline: the tool calls, by 1; with a result in the context, the text. SEEN is
    # sqrt(dim) / n for each <tool_response> among the context's n tokens: times 1e4, above 1
    # in any context shorter than 50,000 tokens.
    output[chains[0][0], NEWLINE] = next_piece
    output[chains[1][0], NEWLINE] = next_piece - 1
    output[chains[1][0], SEEN] = 1e4

    def zeros(*shape: int) -> np.ndarray:
        return np.zeros(shape, np.float32)

    value, attention_output = zeros(dim, dim), zeros(dim, dim)
    value[0, RESULT] = 1  # head dimension 0 carries RESULT...
    attention_output[SEEN, 0] = 1  # ...into SEEN
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_context_length(4096)
    writer.add_embedding_length(dim)
    writer.add_block_count(1)
    writer.add_feed_forward_length(dim)
    writer.add_head_count(1)
    writer.add_head_count_kv(1)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types(types)
    writer.add_unk_token_id(ids["<unk>"])
    writer.add_bos_token_id(ids["<|im_start|>"])
    writer.add_eos_token_id(end)
    writer.add_add_bos_token(False)
    writer.add_add_space_prefix(False)
    writer.add_chat_template(TEMPLATE)
    tensors = {
        "token_embd.weight": embed,
        "output_norm.weight": np.ones(dim, np.float32),
        "output.weight": output,
        "blk.0.attn_norm.weight": np.ones(dim, np.float32),
        "blk.0.attn_q.weight": zeros(dim, dim),
        "blk.0.attn_k.weight": zeros(dim, dim),
        "blk.0.attn_v.weight": value,
        "blk.0.attn_output.weight": attention_output,
        "blk.0.ffn_norm.weight": np.ones(dim, np.float32),
        "blk.0.ffn_gate.weight": zeros(dim, dim),
        "blk.0.ffn_up.weight": zeros(dim, dim),
        "blk.0.ffn_down.weight": zeros(dim, dim),
    }
    for name, tensor in tensors.items():
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def serve(model_path: str) -> None:
    """Serve the model on a free loopback port; print its address; serve until killed."""
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = model_path
    params.hostnames = ["127.0.0.1"]
    params.port = 0
    params.n_ctx = 4096
    params.n_parallel = 1
    params.sampling.temp = 0  # greedy (a request may still set its own temperature)
    params.cpuparams.n_threads = 1
    server = xllamacpp.Server(params)
    print(server.listening_address, flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    serve(sys.argv[1])
