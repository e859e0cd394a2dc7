// The chat page: sends each turn to /chat/completions (the session stands
// for the person; no key in the browser) and streams the answer into the
// log. The conversation lives only in `history`, in this page. Text goes
// into the page as textContent, never as markup.
"use strict";

(function () {
  const root = document.getElementById("chat");
  if (!root) {
    return;
  }
  const csrf = root.dataset.csrf || "";
  const maxTokens = Number(root.dataset.maxTokens) || 512;
  const form = document.getElementById("chat-form");
  const select = document.getElementById("chat-model");
  const input = document.getElementById("chat-input");
  const log = document.getElementById("chat-log");
  const status = document.getElementById("chat-status");
  const send = document.getElementById("chat-send");

  /** @type {{role: string, content: string}[]} */
  const history = [];
  let busy = false;

  function addTurn(role, text) {
    const turn = document.createElement("div");
    turn.className = "turn " + role;
    turn.textContent = text;
    log.appendChild(turn);
    log.scrollTop = log.scrollHeight;
    return turn;
  }

  function say(text, kind) {
    status.textContent = text;
    status.className = kind;
  }

  // The API's refusals come as {"error": {"message": ...}}.
  async function refusal(response) {
    const text = await response.text();
    try {
      const body = JSON.parse(text);
      if (body && body.error) {
        return typeof body.error === "string" ? body.error : body.error.message || text;
      }
    } catch (_) {
      // not JSON: show it as it came
    }
    return text || response.status + " " + response.statusText;
  }

  // The gateway's refusals end by pointing an API client at the
  // x-request-id header, which a person in a browser cannot see: the page
  // names the id itself, for them to give to the operator.
  const headerClause = /[;,]?\s*the x-request-id header names this request to the operator/;

  function explain(message, requestId) {
    const text = message.replace(headerClause, "");
    return requestId ? text + " (request id: " + requestId + ")" : text;
  }

  // Reads the server-sent events, calling onDelta with each piece of text;
  // returns why the answer ended (its finish_reason), if it said.
  async function readStream(body, onDelta) {
    const reader = body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    let finish = null;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) {
        return finish;
      }
      buffer += decoder.decode(value, { stream: true });
      const lines = buffer.split("\n");
      buffer = lines.pop();
      for (const raw of lines) {
        const line = raw.replace(/\r$/, "");
        if (!line.startsWith("data:")) {
          continue;
        }
        const data = line.slice(5).trim();
        if (data === "[DONE]") {
          return finish;
        }
        let chunk;
        try {
          chunk = JSON.parse(data);
        } catch (_) {
          continue;
        }
        if (chunk.error) {
          throw new Error(chunk.error.message || String(chunk.error));
        }
        const choice = chunk.choices && chunk.choices[0];
        if (choice && choice.finish_reason) {
          finish = choice.finish_reason;
        }
        const piece = choice && choice.delta && choice.delta.content;
        if (typeof piece === "string" && piece.length > 0) {
          onDelta(piece);
        }
      }
    }
  }

  // Enter sends; Shift+Enter (or an input method composing) is a new line.
  input.addEventListener("keydown", function (event) {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      form.requestSubmit();
    }
  });

  form.addEventListener("submit", async function (event) {
    event.preventDefault();
    if (busy) {
      return;
    }
    const content = input.value.trim();
    if (!content) {
      return;
    }
    const model = select.value;
    const option = select.selectedOptions[0];
    const onDemand = option && option.dataset.onDemand === "true";

    busy = true;
    send.disabled = true;
    input.value = "";
    const question = addTurn("user", content);
    history.push({ role: "user", content: content });
    say(onDemand ? "loading " + model + "…" : "waiting for " + model + "…", "muted");
    const answer = addTurn("assistant", "");
    let text = "";
    let requestId = null;

    try {
      const response = await fetch("/chat/completions", {
        method: "POST",
        credentials: "same-origin",
        headers: { "content-type": "application/json", "x-csrf-token": csrf },
        body: JSON.stringify({
          model: model,
          messages: history,
          stream: true,
          max_tokens: maxTokens,
        }),
      });
      requestId = response.headers.get("x-request-id");
      if (!response.ok) {
        throw new Error(await refusal(response));
      }
      const finish = await readStream(response.body, function (piece) {
        if (text === "") {
          say("", "muted");
        }
        text += piece;
        answer.textContent = text;
        log.scrollTop = log.scrollHeight;
      });
      history.push({ role: "assistant", content: text });
      // Cut at the page's limit, not finished: said, or the answer read as
      // ending mid-word for no reason.
      say(
        finish === "length"
          ? "the answer stops here: this page gives a turn at most " + maxTokens + " tokens (the API, with a key, has no such limit)"
          : "",
        "muted",
      );
    } catch (error) {
      if (text === "") {
        // Unanswered: the question leaves the conversation and the page,
        // and goes back into the box to be sent again (unless something
        // new was typed meanwhile). A bubble left on screen read as asked,
        // though the next turn no longer carried it.
        history.pop();
        answer.remove();
        question.remove();
        if (input.value.trim() === "") {
          input.value = content;
        }
      } else {
        history.push({ role: "assistant", content: text });
      }
      say(explain(error && error.message ? error.message : String(error), requestId), "error");
    } finally {
      busy = false;
      send.disabled = false;
      input.focus();
    }
  });
})();
