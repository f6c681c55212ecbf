"""TEST DOUBLE: the bodies the stand-in server answers on /v1/completions and /v1/chat/completions, in vLLM
0.25.0's shape (recorded on the H200: tests/fixtures/vllm/h200-chat, where tests/unit/test_standin_chat.py
holds them to it): the same keys in the same order, the ids' prefixes, the objects' names; the first chat
chunk carries the role "assistant" and an empty content, a chunk a token after it, the last with
finish_reason and stop_reason; the `system_fingerprint` ("vllm-0.25.0-<hash8>", --fingerprint-mode) in a
whole answer and on a stream's last chunk (the usage chunk where stream_options.include_usage asks for one).
A request vLLM's validation refuses (a chat with no list of messages) gets its 400 before the model is
looked up, an unknown model vLLM's 404, an empty list of messages the chat template's 400 after it."""
import hashlib
import json
import os
import time
import uuid

import vllm

EMPTY_CONVERSATION = "Cannot apply chat template to an empty conversation. Provide at least one message."
VALIDATING = "entrypoints/serve/utils/api_utils.py\", line 40, in create_chat_completion"  # where vLLM names it


def kind_of(path):
    """The class that answers `path`, or None: the stand-in serves no other."""
    return {"/v1/completions": Completion, "/v1/chat/completions": Chat}.get(path)


def error(code, message, kind, param):
    """vLLM's ErrorResponse."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def usage_of(prompt_tokens, completion_tokens):
    """vLLM's UsageInfo, its keys in its order."""
    return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens}


def fingerprint(options):
    """vLLM's system_fingerprint for these `vllm serve` options (vllm/entrypoints/serve/utils/fingerprint.py):
    "full" (its default) `vllm-VERSION[-tpN][-ppN][-dpN][-ep]-HASH8`, "hash" without the parallelism,
    "custom" --fingerprint-value, "none" None. HASH8 stands in for vLLM's config hash: these options'."""
    mode = options.get("fingerprint_mode") or "full"
    if mode == "none":
        return None
    if mode == "custom":
        return options.get("fingerprint_value")
    config = json.dumps({name: value for name, value in options.items() if name != "dispatch_function"},
                        sort_keys=True, default=str)
    parts = [f"vllm-{vllm.__version__}"]
    if mode == "full":
        parts += [f"{name}{int(options.get(option) or 1)}" for name, option in (
            ("tp", "tensor_parallel_size"), ("pp", "pipeline_parallel_size"), ("dp", "data_parallel_size"))
            if int(options.get(option) or 1) > 1] + (["ep"] if options.get("enable_expert_parallel") else [])
    return "-".join(parts + [hashlib.sha256(config.encode()).hexdigest()[:8]])


class Completion:
    """/v1/completions: `prompt` in, `text` out."""

    PREFIX, OBJECT, CHUNK = "cmpl-", "text_completion", "text_completion"

    def __init__(self, request, system_fingerprint=None):
        self.request = request
        self.fingerprint = system_fingerprint
        self.include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
        self.head = {"id": self.PREFIX + uuid.uuid4().hex, "object": self.CHUNK, "created": int(time.time()),
                     "model": request.get("model")}

    def invalid(self):
        """(status, body) of a request vLLM's validation refuses before it looks at the model, else None."""
        return None

    def unrenderable(self):
        """(status, body) of a request for the served model that vLLM cannot render into a prompt, else None."""
        return None

    def prompt_tokens(self):
        return len(str(self.request.get("prompt") or "").split()) or 1

    def answer(self, text, finish, usage):
        """The whole answer of a request that does not stream."""
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None,
                  "token_ids": None, "prompt_logprobs": None, "prompt_token_ids": None, "routed_experts": None}
        return {**self.head, "object": self.OBJECT, "choices": [choice], **self.whole(usage)}

    def whole(self, usage, **between):
        """The keys of a whole answer after its choices (`between` after the usage)."""
        return {"service_tier": None, "system_fingerprint": self.fingerprint,
                "usage": {**usage, "prompt_tokens_details": None}, **between, "kv_transfer_params": None,
                "metrics": None}

    def opening(self):
        """The chunks before the first token's."""
        return []

    def token(self, text, finish=None):
        """The chunk of one token; with `finish` the last one ("length", or "abort")."""
        return self.last({**self.head, "choices": [{
            "index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None,
            "prompt_token_ids": None, "token_ids": None}]}, finish)

    def last(self, chunk, finish):
        """`chunk`, with the fingerprint where it ends the stream (a finish and no usage chunk after it)."""
        if finish and not self.include_usage and self.fingerprint is not None:
            chunk["system_fingerprint"] = self.fingerprint
        return chunk

    def usage(self, usage):
        """The chunk after the last token's when stream_options.include_usage (None left out)."""
        fingerprint = {} if self.fingerprint is None else {"system_fingerprint": self.fingerprint}
        return {**self.head, "choices": [], "usage": usage, **fingerprint}


class Chat(Completion):
    """/v1/chat/completions: `messages` in (rendered as the chat template's words), a message out."""

    PREFIX, OBJECT, CHUNK = "chatcmpl-", "chat.completion", "chat.completion.chunk"

    def invalid(self):
        """pydantic's error as vLLM words it: the error, where vLLM validates, the route and the errors."""
        messages = self.request.get("messages")
        if isinstance(messages, list):
            return None
        problem = ({"type": "missing", "loc": ("body", "messages"), "msg": "Field required", "input": self.request}
                   if messages is None else
                   {"type": "list_type", "loc": ("body", "messages"), "msg": "Input should be a valid list",
                    "input": messages})
        where = f'{os.path.dirname(vllm.__file__)}/{VALIDATING}'
        message = f'1 validation error:\n  {problem!r}\n\n  File "{where}\n    POST /v1/chat/completions {[problem]!r}'
        return 400, error(400, message, "Bad Request", "body.messages")

    def unrenderable(self):
        """An empty conversation: the chat template's ValueError, which vLLM answers as a BadRequestError."""
        return None if self.request["messages"] else (400, error(400, EMPTY_CONVERSATION, "BadRequestError", None))

    def prompt_tokens(self):
        """`<|im_start|> ROLE CONTENT <|im_end|>` a message, then `<|im_start|> assistant`."""
        return sum(len(str(message.get("content") or "").split()) + 3 for message in self.request["messages"]
                   if isinstance(message, dict)) + 2

    def answer(self, text, finish, usage):
        message = {"role": "assistant", "content": text, "refusal": None, "annotations": None, "audio": None,
                   "function_call": None, "reasoning": None}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish, "stop_reason": None,
                  "token_ids": None, "routed_experts": None}
        return {**self.head, "object": self.OBJECT, "choices": [choice],
                **self.whole(usage, prompt_logprobs=None, prompt_token_ids=None, prompt_text=None)}

    def opening(self):
        return [{**self.head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                           "finish_reason": None}], "prompt_token_ids": None, "prompt_text": None}]

    def token(self, text, finish=None):
        ending = {"stop_reason": None} if finish else {}
        return self.last({**self.head, "choices": [{"index": 0, "delta": {"content": text}, "logprobs": None,
                                                    "finish_reason": finish, **ending, "token_ids": None}]}, finish)
