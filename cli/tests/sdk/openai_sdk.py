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

    # A route the gateway does not have is an error the SDK can read (the
    # Responses API, which some agent frameworks use by default).
    try:
        client.responses.create(model=model, input="hi")
        raise AssertionError("the gateway has no Responses API")
    except openai.NotFoundError as e:
        assert e.body["code"] == "unknown_url", e.body
        assert "/v1/responses" in e.body["message"], e.body

    print("ok")


if __name__ == "__main__":
    main()
