"""TEST DOUBLE: the bodies the stand-in server answers on /v1/completions and /v1/chat/completions, in vLLM
0.25.0's shape (tests/fixtures/vllm/h200-chat, where tests/unit/test_standin_chat.py holds them to it): the
same keys in the same order, the ids' prefixes, the objects' names; the first chat chunk carries the role
"assistant" and an empty content, a chunk a token after it, the last with finish_reason and stop_reason.
A request vLLM's validation refuses (a chat with no list of messages) gets its 400 before the model is
looked up, an unknown model vLLM's 404."""
import time
import uuid


def kind_of(path):
    """The class that answers `path`, or None: the stand-in serves no other."""
    return {"/v1/completions": Completion, "/v1/chat/completions": Chat}.get(path)


def error(code, message, kind, param):
    """vLLM's ErrorResponse."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class Completion:
    """/v1/completions: `prompt` in, `text` out."""

    PREFIX, OBJECT, CHUNK = "cmpl-", "text_completion", "text_completion"

    def __init__(self, request):
        self.request = request
        self.head = {"id": self.PREFIX + uuid.uuid4().hex, "object": self.CHUNK, "created": int(time.time()),
                     "model": request.get("model")}

    def problem(self):
        """(status, body) of a request vLLM refuses before it looks at the model, else None."""
        return None

    def prompt_tokens(self):
        return len(str(self.request.get("prompt") or "").split()) or 1

    def answer(self, text, finish, usage):
        """The whole answer of a request that does not stream."""
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
        return {**self.head, "object": self.OBJECT, "choices": [choice], "usage": usage}

    def opening(self):
        """The chunks before the first token's."""
        return []

    def token(self, text, finish=None):
        """The chunk of one token; with `finish` the last one ("length", or "abort" with no text)."""
        return {**self.head, "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                                          "stop_reason": None, "prompt_token_ids": None, "token_ids": None}]}

    def usage(self, usage):
        """The chunk after the last token's when stream_options.include_usage."""
        return {**self.head, "choices": [], "usage": usage}


class Chat(Completion):
    """/v1/chat/completions: `messages` in (rendered as the chat template's words), a message out."""

    PREFIX, OBJECT, CHUNK = "chatcmpl-", "chat.completion", "chat.completion.chunk"

    def problem(self):
        messages = self.request.get("messages")
        if not isinstance(messages, list) or not messages:
            message = ("Field required" if messages is None else
                       "Input should be a valid list" if not isinstance(messages, list) else
                       "List should have at least 1 item")
            return 400, error(400, f"[{{'loc': ('body', 'messages'), 'msg': {message!r}}}]", "Bad Request",
                              "body.messages")
        return None

    def prompt_tokens(self):
        """`<|im_start|> ROLE CONTENT <|im_end|>` a message, then `<|im_start|> assistant`."""
        return sum(len(str(message.get("content") or "").split()) + 3 for message in self.request["messages"]
                   if isinstance(message, dict)) + 2

    def answer(self, text, finish, usage):
        message = {"role": "assistant", "content": text, "refusal": None, "annotations": None, "audio": None,
                   "function_call": None, "reasoning": None}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish, "stop_reason": None,
                  "token_ids": None, "routed_experts": None}
        return {**self.head, "object": self.OBJECT, "choices": [choice], "service_tier": None,
                "system_fingerprint": None, "usage": {**usage, "prompt_tokens_details": None},
                "prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None, "kv_transfer_params": None,
                "metrics": None}

    def opening(self):
        return [{**self.head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                           "finish_reason": None}], "prompt_token_ids": None, "prompt_text": None}]

    def token(self, text, finish=None):
        ending = {"stop_reason": None} if finish else {}
        return {**self.head, "choices": [{"index": 0, "delta": {"content": text}, "logprobs": None,
                                          "finish_reason": finish, **ending, "token_ids": None}]}
