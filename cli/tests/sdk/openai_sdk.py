"""The official OpenAI Python SDK against a running llmgw gateway.

Usage: python3 openai_sdk.py BASE_URL MODEL
Exits non-zero, with the reason, on the first thing that does not work.
"""

import sys

import openai


def main() -> None:
    base, model = sys.argv[1], sys.argv[2]
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused-with-auth-off", max_retries=0)

    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=3
    )
    # The sim's text is deterministic in its context: three words now, and
    # the same three first when four are asked for.
    first = reply.choices[0].message.content
    assert len(first.split()) == 3, reply
    assert reply.usage.completion_tokens == 3, reply.usage

    pieces, usage = [], None
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage:
            usage = chunk.usage
    streamed = "".join(pieces)
    assert streamed.startswith(first) and len(streamed.split()) == 4, pieces
    assert usage is not None and usage.completion_tokens == 4, usage

    # Without include_usage the SDK sees no usage chunk (the gateway asked
    # the engine for one and took it out).
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2, stream=True
    )
    chunks = list(stream)
    assert all(c.usage is None for c in chunks), chunks[-1]

    text = client.completions.create(model=model, prompt="once upon", max_tokens=1)
    assert len(text.choices[0].text.split()) == 1, text

    emb = client.embeddings.create(model=model, input=["a", "b"])
    assert len(emb.data) == 2 and len(emb.data[0].embedding) == 16, emb

    listed = [m.id for m in client.models.list()]
    assert model in listed, listed
    assert client.models.retrieve(model).id == model
    try:
        client.models.retrieve("nope")
        raise AssertionError("an unknown model has no entry")
    except openai.NotFoundError:
        pass

    try:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
        raise AssertionError("an unknown model must fail")
    except openai.NotFoundError as e:
        assert e.body["code"] == "model_not_found", e.body

    responses(client, model, first)

    print("ok")


def responses(client: openai.OpenAI, model: str, first: str) -> None:
    """The Responses API, which agent frameworks use by default, served as
    the chat completion it turns into: the same words for the same
    conversation."""
    r = client.responses.create(model=model, input="hello", max_output_tokens=3)
    assert r.output_text == first, r
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens", r
    assert r.usage.output_tokens == 3 and r.usage.input_tokens > 0, r.usage
    assert r.id.startswith("resp_") and r.output[0].id.startswith("msg_"), r

    # Streamed, through the SDK's own accumulating helper, which checks
    # that every event fits the one before (the sim stops by itself).
    deltas = []
    with client.responses.stream(model=model, input="hello") as s:
        for event in s:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = s.get_final_response()
    assert "".join(deltas) == final.output_text and final.status == "completed", (deltas, final)
    assert final.output_text.startswith(first), final
    words = len(final.output_text.split())
    assert final.usage is not None and final.usage.output_tokens == words, final.usage
    # Cut at its limit, a stream ends incomplete, as OpenAI's does.
    events = list(client.responses.create(model=model, input="hello", max_output_tokens=4, stream=True))
    assert events[-1].type == "response.incomplete", events[-1]
    assert len(events[-1].response.output_text.split()) == 4, events[-1]
    assert events[-1].response.usage.output_tokens == 4, events[-1]

    # A function tool: the model calls it, the client runs it and sends
    # the call and its output back.
    weather = {"type": "function", "name": "weather", "description": "today's weather",
               "parameters": {"type": "object", "properties": {}}}
    asked = [{"role": "user", "content": "weather?"}]
    r = client.responses.create(model=model, input=asked, tools=[weather], instructions="be brief")
    call = r.output[0]
    assert call.type == "function_call" and call.name == "weather", r.output
    assert r.instructions == "be brief" and r.tools[0].name == "weather", r
    turn = asked + [
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
    ]
    r = client.responses.create(model=model, input=turn, tools=[weather], tool_choice="none",
                                max_output_tokens=2)
    assert r.output[0].type == "message" and len(r.output_text.split()) == 2, r.output
    events = list(client.responses.create(model=model, input=asked, tools=[weather], stream=True))
    assert events[-1].type == "response.completed", events[-1]
    assert events[-1].response.output[0].name == "weather", events[-1]

    # The engine's own settings pass as on chat (vLLM's extras through
    # extra_body), and log probabilities may be asked for as the SDKs do.
    r = client.responses.create(model=model, input="hello", max_output_tokens=3,
                                top_logprobs=0, include=["message.output_text.logprobs"],
                                extra_body={"top_k": 5, "chat_template_kwargs": {"enable_thinking": False}})
    assert r.output_text == first, r

    # What needs responses kept is refused by name, not ignored.
    try:
        client.responses.create(model=model, input="hi", previous_response_id=r.id)
        raise AssertionError("no response is kept to continue")
    except openai.BadRequestError as e:
        assert e.body["param"] == "previous_response_id", e.body
    try:
        client.responses.retrieve(r.id)
        raise AssertionError("no response is kept to read")
    except openai.NotFoundError as e:
        assert "keeps none" in e.body["message"], e.body
    try:
        client.responses.create(model="nope", input="x")
        raise AssertionError("an unknown model must fail")
    except openai.NotFoundError as e:
        assert e.body["code"] == "model_not_found", e.body


if __name__ == "__main__":
    main()
