"""Drives llmgw's /mcp with the official MCP Python SDK (mcp==1.30.0).

Usage: mcp_client.py BASE KEY. The notes of KEY's project must be switched
on, and the note "from-rest" written through /v1/memory beforehand. Leaves
the note "from-mcp" behind for the caller to read through /v1/memory.
Exits non-zero, saying why, on the first thing that is not as expected.
"""

import asyncio
import sys

from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client


def text(result):
    return "\n".join(c.text for c in result.content if c.type == "text")


def check(cond, what):
    if not cond:
        sys.exit(f"mcp_client: {what}")


async def main(base, key):
    headers = {"Authorization": f"Bearer {key}"}
    async with streamablehttp_client(f"{base}/mcp", headers=headers) as (read, write, _):
        async with ClientSession(read, write) as s:
            init = await s.initialize()
            check(init.serverInfo.name == "llmgw", f"server info: {init.serverInfo}")
            names = sorted(t.name for t in (await s.list_tools()).tools)
            check(names == ["forget", "recall", "remember"], f"tools: {names}")

            r = await s.call_tool("recall", {"key": "from-rest"})
            check(not r.isError, f"recall from-rest: {text(r)}")
            check(text(r) == "Written through the REST API", f"from-rest reads {text(r)!r}")

            r = await s.call_tool(
                "remember",
                {"key": "rack-plan", "text": "Roll the GPU nodes one rack at a time", "tags": ["ops"]},
            )
            check(not r.isError and "remembered" in text(r), f"remember: {text(r)}")
            r = await s.call_tool("remember", {"key": "rack-plan", "text": "Roll two racks at a time", "tags": ["ops"]})
            check(not r.isError and "replaced" in text(r), f"remember again: {text(r)}")

            r = await s.call_tool("recall", {"query": "racks"})
            check(not r.isError and "rack-plan: Roll two racks at a time" in text(r), f"recall query: {text(r)}")
            check(r.structuredContent["notes"][0]["tags"] == ["ops"], f"structured: {r.structuredContent}")
            r = await s.call_tool("recall", {"tag": "ops"})
            check([n["key"] for n in r.structuredContent["notes"]] == ["rack-plan"], f"by tag: {r.structuredContent}")

            r = await s.call_tool("forget", {"key": "rack-plan"})
            check(not r.isError, f"forget: {text(r)}")
            r = await s.call_tool("recall", {"key": "rack-plan"})
            check(r.isError and "no note" in text(r), f"recall of a forgotten note: {text(r)}")

            # A limit's refusal names the limit, for the model to read.
            r = await s.call_tool("remember", {"key": "tags", "text": "x", "tags": [f"t{i}" for i in range(17)]})
            check(r.isError and "16" in text(r), f"17 tags: {text(r)}")
            r = await s.call_tool("remember", {"key": "k" * 201, "text": "x"})
            check(r.isError and "200" in text(r), f"a long key: {text(r)}")

            r = await s.call_tool("remember", {"key": "from-mcp", "text": "Written through MCP", "tags": ["mcp"]})
            check(not r.isError, f"remember from-mcp: {text(r)}")
    print("mcp_client: ok")


asyncio.run(main(sys.argv[1], sys.argv[2]))
