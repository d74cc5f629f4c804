"""An OpenAI-compatible endpoint over a rollout engine: ``/v1/chat/completions`` and ``/v1/completions``
on 127.0.0.1, so an agent written against the ``openai`` client (or any harness that speaks its API)
samples from the policy as it trains, and ``rlpost serve`` serves a trained model the same way.

Server. Starlette on uvicorn, in a thread of this process: the ASGI pair under FastAPI, on which
vLLM and SGLang serve their OpenAI APIs. FastAPI itself would add pydantic's validation of bodies,
and here bodies are checked by hand, so that a malformed request gets one line naming its field,
in OpenAI's error shape (a 422 of pydantic's would not say it in the client's terms). The HTTP
thread never touches the model or the tokenizer: each request
goes into ``inbox`` with a future, and the thread that owns the engine (the training loop's, or
``rlpost serve``'s main thread) calls ``step``: every request waiting by then is rendered with the
chat template and decoded together, and each future is resolved with its answer. Torch and the
tokenizer so stay on one thread, as everywhere else in rlpost.

Continuous. On an engine that admits rows into a running decode (``admits``: FastRollout, the CPU
decode loop, through ``sample_feed`` and roles/slots.py: Admissions), a request that arrives during
a decode joins it between two decode steps, prefilled and given a free decode slot, when its
sampling settings are the decode's (temperature, top-p, no stop strings; others are rendered and
held for the next decode), and every request is answered the moment its own row ends, not when the
decode's longest row does. Engines that cannot admit keep one engine call per batch (``sample_ids``,
their own batching inside it), every answer when it ends, requests arriving meanwhile forming the
next batch: transformers' generate path (HFRollout, and VLLMRollout on it), the CUDA static engine
(StaticRollout, whose decode is captured graphs over a fixed arena), and any call with stop strings
(FastRollout hands those to HFRollout).

Episodes. During training each episode gets a base URL of its own, ``.../ep/<key>/v1``: an agent
is handed a client and needs no change (no header or body field to remember, which harnesses such
as LangGraph or verifiers do not pass through). Every call of an episode is recorded as the
engine saw it: the prompt ids, the drawn ids and their sampler log-probs (``Record``). A call whose
messages continue the episode's last call (the same messages, the returned assistant message, then
new ones) is encoded as that call's ids plus the template's text for the new messages
(envs/transcript.py: chat_delta), so no drawn token is ever re-tokenised; any other call is
rendered afresh and must start with the episode's ids so far (prefix consistency), else the
episode's training sequence stops before it (``breaks``, counted). Training forces the run's
temperature and top-p on every call (the trainer scores softmax(logits / T)); an agent's own are
ignored there and honoured by ``rlpost serve``.

Refusals (HTTP 400 in OpenAI's error shape, so the client raises ``BadRequestError``): a body
that is not what the API says, a prompt past the model's context, an episode past its
``max_calls`` or ``max_episode_tokens``; in an episode each also ends the episode (its later
calls are refused too) with reward 0 and a counted error (roles/rollout_agent.py).
"""

from __future__ import annotations

import asyncio
import json
import queue
import socket
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field

from rlpost.console import say_once
from rlpost.envs.transcript import TOOL_CALL, TemplateError, assistant_message, chat_delta, encode, for_template, render
from rlpost.roles.openai_body import (Refused, chat_messages, chunks, error_body, logprobs_asked, logprobs_body, number,
                                     same, tool_schemas)
from rlpost.roles.rollout_env import Episode

@dataclass
class Limits:
    """What one call may ask for. ``context``: the model's (0: not known); ``max_new_tokens``: the
    cap on a call's tokens (a request's max_tokens may only lower it); in episodes, ``max_calls`` and
    ``max_episode_tokens`` (the tokens after the first prompt, the model's and the agent's together)."""

    max_new_tokens: int
    context: int = 0
    max_calls: int = 0
    max_episode_tokens: int = 0


@dataclass
class Record:
    """One episode's calls as the engine saw them. ``episode`` holds the training sequence (first
    prompt, then per call the agent's inserted tokens masked and the drawn ones with their
    log-probs: roles/rollout_env.Episode), ``last`` what the next call must repeat to continue it."""

    episode: Episode
    calls: int = 0  # calls served, recorded or not
    breaks: int = 0  # calls that did not continue the recorded sequence (not recorded)
    error: str = ""  # the first refusal; the episode has ended
    last: tuple | None = None  # (messages as sent, the assistant message returned, tools, ended with EOS)
    row: dict = field(default_factory=dict)


@dataclass
class _Job:
    """A request rendered and ready to decode."""

    future: Future
    record: Record | None
    ids: list[int]
    max_new: int
    sampling: tuple  # (temperature, top_p, stop strings)
    kind: str  # chat | completion
    extend: tuple = ()  # (messages, tools) the call sent, for the record's ``last``
    stream: bool = False  # answered as server-sent events
    logprobs: bool = False  # the drawn tokens' log-probs in the answer (openai_body.logprobs_asked)
    at: float = 0.0  # when it arrived (monotonic)


class Endpoint:
    """The OpenAI-compatible API over ``engine`` (anything with ``sample_ids``, ``tok``, ``eos_set``)."""

    # In episodes, a batch is decoded once every running episode waits on the endpoint, or once the
    # oldest request, counted from the last decode's end, has waited GATHER_S or a quarter of the
    # last decode's time, whichever is longer: the agents just answered need a moment to send their
    # next call (a process woken on a loaded machine: 50-100 ms), and without that wait they fall
    # into two groups decoded in turn for the rest of the step (measured: 8 guess games on the
    # embedded model, decodes of 3 and 5 rows alternating). The wait costs at most a quarter of a
    # decode, which costs about as much for 3 rows as for 8 (a decode step is mostly fixed cost). On an
    # engine that admits requests into a running decode the wait is GATHER_S at most: a late one joins.
    GATHER_S = 0.05
    GATHER_FRACTION = 0.25
    # On an engine that admits requests into a running decode, requests join it for this long while
    # episodes run (``step``'s ``running``): the caller looks after its agents between steps (the pool's
    # deadlines, queued episodes), and a decode that kept admitting would keep it from them.
    ADMIT_S = 2.0
    # A request joins a running decode once the oldest waiting one has waited this long (0: at the next
    # step). Waiting to join agents' calls together measured no gain (50 ms: within the noise on the
    # embedded model, more decodes and slower on the tiny one; benchmarks/README.md: agent_overhead).
    JOIN_S = 0.0
    # A call of an episode that has ended is refused after this long: an agent that swallows the
    # refusal and calls again in a loop would otherwise keep a core busy until its deadline.
    ENDED_DELAY_S = 1.0

    def __init__(self, engine, limits: Limits, name: str = "rlpost"):
        self.engine, self.tok, self.limits, self.name = engine, engine.tok, limits, name
        self.eos_texts = [self.tok.decode([i]) for i in sorted(engine.eos_set)]
        self.inbox: queue.Queue = queue.Queue()
        self.records: dict[str, Record] = {}
        self.forced: tuple | None = None  # (temperature, top_p) in training
        self.server, self.thread, self.url = None, None, ""
        self.decodes = 0
        self.answered = 0  # requests answered or refused, all steps
        self.held: list[_Job] = []  # rendered during a decode, of other sampling settings: the next decode's
        self.admit = True  # requests join a running decode where the engine admits them (False: never)
        self.last_end, self.last_decode_s = 0.0, 0.0  # when the last decode ended (monotonic), how long it took

    # --- the server ------------------------------------------------------------------------------

    def start(self, port: int = 0) -> str:
        """Serve on 127.0.0.1:port (0: a free one) from a thread; returns the base URL (…/v1)."""
        import uvicorn  # the agents extra: loaded where an endpoint runs, never by a plain run

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        config = uvicorn.Config(self._app(), log_level="warning", access_log=False, timeout_keep_alive=30,
                                timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True,
                                       name="rlpost-endpoint")
        self.thread.start()
        while not self.server.started and self.thread.is_alive():
            time.sleep(0.01)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        return self.url + "/v1"

    def stop(self) -> None:
        """Stop serving: what is still queued is refused, the server thread ends."""
        self._refuse_waiting("the endpoint stopped")
        if self.server is not None:
            self.server.should_exit = True
            self.thread.join(timeout=10)
            self.server = None

    def _app(self):
        from starlette.applications import Starlette
        from starlette.requests import ClientDisconnect
        from starlette.responses import JSONResponse, Response
        from starlette.routing import Route

        def route(path: str, kind: str) -> Route:
            async def handle(request) -> JSONResponse:
                future: Future = Future()
                episode = request.path_params.get("episode")
                try:
                    body = await request.body()
                except ClientDisconnect:  # an agent killed mid-request (its deadline): nobody to answer
                    return JSONResponse(error_body("the client went away", "client_disconnect"), status_code=400)
                self.inbox.put((time.monotonic(), kind, episode, body, future))
                status, payload = await asyncio.wrap_future(future)
                if status == 400 and payload["error"]["code"] == "episode_ended":
                    await asyncio.sleep(self.ENDED_DELAY_S)  # an agent that ignores refusals calls once a second
                if status == 200 and payload.pop("_stream", False):  # the whole answer as server-sent events
                    return Response("".join(f"data: {json.dumps(c)}\n\n" for c in chunks(payload)) + "data: [DONE]\n\n",
                                    media_type="text/event-stream")
                return JSONResponse(payload, status_code=status)

            return Route(path, handle, methods=["POST"])

        async def models(request) -> JSONResponse:
            listed = [{"id": self.name, "object": "model", "owned_by": "rlpost"}]
            return JSONResponse({"object": "list", "data": listed})

        return Starlette(routes=[
            route("/v1/chat/completions", "chat"), route("/v1/completions", "completion"),
            route("/ep/{episode}/v1/chat/completions", "chat"), route("/ep/{episode}/v1/completions", "completion"),
            Route("/v1/models", models), Route("/ep/{episode}/v1/models", models)])

    # --- episodes --------------------------------------------------------------------------------

    def open(self, row: dict) -> tuple[str, str]:
        """A new episode: (its key, its base URL)."""
        key = uuid.uuid4().hex[:12]
        self.records[key] = Record(Episode(row), row=row)
        return key, f"{self.url}/ep/{key}/v1"

    def close(self, key: str) -> Record:
        """The episode's record; its later calls are refused (an agent killed mid-call leaves one queued)."""
        return self.records.pop(key)

    # --- the engine's side -----------------------------------------------------------------------

    def step(self, running: int = 0, wait: float = 0.0) -> int:
        """Decode what waits, when enough waits (``running``: episodes still going, 0: decode whatever
        waits); waits up to ``wait`` seconds for a first request. On an engine that admits rows into a
        running decode (``admits``), requests that arrive meanwhile join it (those of the same sampling
        settings), for ``ADMIT_S`` seconds when ``running`` (the caller has agents to look after), for as
        long as they come otherwise, and each is answered when its own row ends. Returns the requests
        answered."""
        answered, admits = self.answered, self.admit and getattr(self.engine, "admits", False)
        items = []
        if not self.held:
            try:
                items.append(self.inbox.get(timeout=wait) if wait > 0 else self.inbox.get_nowait())
            except queue.Empty:
                return 0
            since = max(items[0][0], self.last_end)  # late ones join an admitting engine's decode anyway
            patience = max(self.GATHER_S, 0.0 if admits else self.GATHER_FRACTION * self.last_decode_s)
            while running and self.inbox.qsize() + 1 < running and time.monotonic() - since < patience:
                time.sleep(0.002)
        jobs, self.held = self.held + [job for job in map(self._job, items + self._drain()) if job is not None], []
        groups: dict[tuple, list[_Job]] = {}
        for job in jobs:
            groups.setdefault(job.sampling, []).append(job)
        t0, served = time.monotonic(), list(jobs)
        try:
            for sampling, group in groups.items():
                if admits and not sampling[2]:  # stop strings: the engine's other path
                    until = time.monotonic() + self.ADMIT_S if running else float("inf")
                    self.engine.sample_feed(*self._admitting(sampling, group, served, until), *sampling[:2])
                else:
                    self._decode(sampling, group)
                self.decodes += 1
        except BaseException:  # Ctrl-C mid-decode, a failing engine: no client is left waiting for ever
            for job in served:
                if not job.future.done():
                    job.future.set_result((503, error_body("the server stopped during this request", "unavailable")))
            raise
        if jobs:
            self.last_end = time.monotonic()
            self.last_decode_s = self.last_end - t0
        return self.answered - answered

    def _decode(self, sampling: tuple, group: list[_Job]) -> None:
        """One engine call for the group, each request answered when the call ends (an engine that
        does not admit rows mid-decode, or stop strings)."""
        temperature, top_p, stops = sampling
        outs = self.engine.sample_ids([j.ids for j in group], temperature, top_p, max(j.max_new for j in group),
                                      list(stops))
        for job, (ids, logps, how) in zip(group, outs):
            if len(ids) > job.max_new:  # decoded with a longer call's budget: cut to its own
                ids, logps, how = ids[: job.max_new], logps[: job.max_new], "length"
            self._finish(job, ids, logps, how)

    def _admitting(self, sampling: tuple, first: list[_Job], served: list[_Job], until: float) -> tuple:
        """(feed, done) for the engine's ``sample_feed`` decoding ``first``: then, between two decode
        steps and until ``until``, more requests of the same sampling (``_more``); each answered as
        its row ends."""
        rows: list[_Job] = []

        def feed(room: int | None) -> list[tuple[list[int], int]]:
            take = list(first) if room is None else self._more(sampling, room) if time.monotonic() < until else []
            rows.extend(take)
            served.extend(take if room is not None else [])
            return [(j.ids, j.max_new) for j in take]

        def done(i: int, ids: list[int], logps: list[float], how: str) -> None:
            self._finish(rows[i], ids, logps, how)

        return feed, done

    def _more(self, sampling: tuple, room: int) -> list[_Job]:
        """Up to ``room`` requests of these sampling settings, oldest first, once the oldest has waited
        ``JOIN_S``; what the inbox holds is rendered now (refusals answered) and held till then, those
        of other settings till the next decode. None that came after one of other settings: a stream
        of requests would otherwise keep this decode going and theirs waiting for ever."""
        self.held += [job for job in map(self._job, self._drain()) if job is not None]
        other = min((j.at for j in self.held if j.sampling != sampling), default=float("inf"))
        mine = [j for j in self.held if j.sampling == sampling and j.at <= other]
        if not mine or time.monotonic() - mine[0].at < self.JOIN_S:
            return []
        take = mine[:room]
        self.held = [j for j in self.held if not any(j is t for t in take)]
        return take

    def _finish(self, job: _Job, ids: list[int], logps: list[float], how: str) -> None:
        job.future.set_result((200, {**self._answer(job, ids, logps, how), "_stream": job.stream}))
        self.answered += 1

    def _drain(self, most: int = 0) -> list[tuple]:
        """Requests waiting in the inbox, at most ``most`` (0: all)."""
        items = []
        while not most or len(items) < most:
            try:
                items.append(self.inbox.get_nowait())
            except queue.Empty:
                break
        return items

    def _refuse_waiting(self, why: str) -> None:
        for job in self.held:
            job.future.set_result((400, error_body(why, "unavailable")))
        self.held = []
        for item in self._drain():
            item[-1].set_result((400, error_body(why, "unavailable")))

    def _job(self, item: tuple) -> _Job | None:
        """A request checked and rendered, or its future resolved with a refusal (None)."""
        _, kind, key, body, future = item
        record = self.records.get(key) if key is not None else None
        try:
            if key is not None and record is None:
                raise Refused(f"no running episode {key!r} (it ended, or its agent's deadline passed)", "unavailable")
            if record is not None and record.error:
                raise Refused(f"this episode has ended: {record.error}", "episode_ended")
            try:
                request = json.loads(body)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise Refused(f"the body is not JSON ({e})") from None
            if not isinstance(request, dict):
                raise Refused(f"the body is a JSON {type(request).__name__}, expected an object")
            job = self._render(kind, request, record, future)
            job.at = item[0]
            if record is not None:
                record.calls += 1
                if self.limits.max_calls and record.calls > self.limits.max_calls:
                    raise Refused(f"more than {self.limits.max_calls} calls in one episode (task.max_turns)",
                                  "too_many_calls")
            return job
        except Refused as e:
            if record is not None and not record.error:
                record.error = str(e)
            future.set_result((400, error_body(str(e), e.code)))
            self.answered += 1
            return None

    def _render(self, kind: str, request: dict, record: Record | None, future: Future) -> _Job:
        """The request's prompt ids, budget and sampling, checked field by field."""
        if request.get("n", 1) not in (1, None):
            raise Refused(f"n: only 1 completion a request is served, got {request.get('n')!r}")
        temperature = number(request, "temperature", 1.0, 0.0, 2.0)
        top_p = number(request, "top_p", 1.0, 1e-6, 1.0)
        asked = request.get("max_completion_tokens", request.get("max_tokens"))
        if asked is not None and (isinstance(asked, bool) or not isinstance(asked, int) or asked < 1):
            raise Refused(f"max_tokens: expected a whole number >= 1, got {asked!r}")
        stops = request.get("stop") or []
        stops = [stops] if isinstance(stops, str) else stops
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise Refused(f"stop: expected a string or a list of non-empty strings, got {str(stops)[:60]!r}")
        if kind == "chat":
            messages, tools = chat_messages(request.get("messages")), tool_schemas(request.get("tools"))
            ids, extend = self._chat_ids(record, messages, tools), (messages, tools)
        else:
            ids, extend = self._completion_ids(request.get("prompt")), ()
        if self.forced is not None:  # training: the policy the trainer scores, whatever the agent asked
            temperature, top_p = self.forced
        job = _Job(future, record, ids, self._budget(record, ids, asked), (temperature, top_p, tuple(stops)), kind,
                   extend)
        job.stream = bool(request.get("stream"))
        job.logprobs = logprobs_asked(request, kind)
        return job

    def _chat_ids(self, record: Record | None, messages: list[dict], tools: list[dict] | None) -> list[int]:
        """The prompt ids of a chat request: its episode's ids so far plus the template's text for
        the new messages when it continues the last call (no drawn token re-encoded), else rendered afresh."""
        if record is not None and record.last is not None and not record.breaks:
            sent, returned, last_tools, closed = record.last
            k = len(sent)
            if tools == last_tools and len(messages) > k + 1 and same(messages[:k], sent) \
                    and same([messages[k]], [returned]):
                e = record.episode
                try:
                    delta = chat_delta(self.tok, [*map(for_template, sent), for_template(returned)],
                                       [for_template(m) for m in messages[k + 1:]], tools, self.eos_texts, closed)
                    return e.prompt + e.ids + encode(self.tok, delta)
                except TemplateError:
                    pass  # rendered afresh below, then checked for prefix consistency
        try:
            return encode(self.tok, render(self.tok, [for_template(m) for m in messages], tools, True))
        except Exception as e:  # noqa: BLE001 - jinja's errors on odd messages: the request's fault
            raise Refused(f"messages: the chat template cannot render them ({type(e).__name__}: {e})") from None

    def _completion_ids(self, prompt) -> list[int]:
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str) and prompt:
            return encode(self.tok, prompt)
        vocab = len(self.tok)
        if isinstance(prompt, list) and prompt and all(type(t) is int and 0 <= t < vocab for t in prompt):
            return list(prompt)  # token ids in, as the API allows
        raise Refused(f"prompt: expected a non-empty string or a list of token ids below {vocab}, "
                      f"got {str(prompt)[:60]!r}")

    def _continues(self, record: Record, ids: list[int]) -> bool:
        e = record.episode
        if not e.prompt:
            return True  # the episode's first call
        seq = e.prompt + e.ids
        return not record.breaks and ids[: len(seq)] == seq

    def _budget(self, record: Record | None, ids: list[int], asked: int | None) -> int:
        """Tokens this call may draw: its max_tokens, the cap, the context and the episode's room."""
        lim = self.limits
        if record is None and asked is not None and asked > lim.max_new_tokens:  # served alone, not in an episode
            say_once(f"a request asked for max_tokens={asked}; this endpoint draws at most {lim.max_new_tokens} "
                     "tokens a request (rlpost serve --max-tokens), and such answers end with finish_reason "
                     "'length'", key="endpoint max_tokens")
        budget = min(asked or lim.max_new_tokens, lim.max_new_tokens)  # in an episode, the run's cap lowers it
        if lim.context:
            if len(ids) >= lim.context:
                raise Refused(f"the prompt is {len(ids)} tokens, and the model's context is {lim.context}",
                              "context_length_exceeded")
            if record is None and asked is not None and len(ids) + asked > lim.context:  # as vLLM and OpenAI refuse
                raise Refused(f"max_tokens: the prompt's {len(ids)} tokens and {asked} more pass the model's context "
                              f"of {lim.context}; ask for at most {lim.context - len(ids)}", "context_length_exceeded")
            budget = min(budget, lim.context - len(ids))
        if record is not None and lim.max_episode_tokens:
            first = len(record.episode.prompt) or len(ids)
            room = lim.max_episode_tokens - (len(ids) - first)
            if room <= 0:
                raise Refused(f"the episode is past task.max_episode_tokens={lim.max_episode_tokens} tokens after "
                              "its first prompt", "context_length_exceeded")
            budget = min(budget, room)
        return budget

    def _answer(self, job: _Job, ids: list[int], logps: list[float], how: str) -> dict:
        """The OpenAI response; the call recorded in its episode."""
        text = self.tok.decode(ids, skip_special_tokens=True)
        found = [text.find(s) for s in job.sampling[2] if s in text]
        if found:  # the text ends before the stop string, as OpenAI's and vLLM's do (the episode keeps the tokens)
            text = text[:min(found)]
        message = assistant_message(text)
        calls = message.get("tool_calls", [])
        finish = "tool_calls" if calls else "length" if how == "length" else "stop"
        if job.record is not None:
            self._record(job, ids, logps, message if job.kind == "chat" else None, how)
        usage = {"prompt_tokens": len(job.ids), "completion_tokens": len(ids),
                 "total_tokens": len(job.ids) + len(ids)}
        head = {"id": f"rlpost-{uuid.uuid4().hex[:16]}", "created": int(time.time()), "model": self.name,
                "usage": usage}
        logprobs = logprobs_body(job.kind, *self._pieces(ids, logps, len(text))) if job.logprobs else None
        if job.kind == "completion":
            return {**head, "object": "text_completion",
                    "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": logprobs}]}
        content = TOOL_CALL.sub("", text).strip() if calls else text
        reply = {"role": "assistant", "content": content or (None if calls else ""),
                 **({"tool_calls": calls} if calls else {})}
        return {**head, "object": "chat.completion",
                "choices": [{"index": 0, "message": reply, "finish_reason": finish, "logprobs": logprobs}]}

    def _pieces(self, ids: list[int], logps: list[float], upto: int) -> tuple[list[str], list[float]]:
        """Each drawn token's text (what it adds to the decoded text: a character split across tokens
        lands on the one that completes it) and log-prob, for the tokens that start before ``upto``
        characters: those of the text returned, which ends before a stop string."""
        pieces, said = [], ""
        for i in range(len(ids)):
            if len(said) >= upto:
                break
            now = self.tok.decode(ids[: i + 1], skip_special_tokens=True)
            pieces.append(now[len(said):])
            said = now
        return pieces, [float(x) for x in logps[: len(pieces)]]

    def _record(self, job: _Job, ids: list[int], logps: list[float], message: dict | None, how: str) -> None:
        record, e = job.record, job.record.episode
        if not self._continues(record, job.ids):  # checked now: a call of the same batch may have been recorded first
            record.breaks += 1  # not a continuation: served, not recorded (the sequence stops before it)
            return
        if not e.prompt:
            e.prompt = list(job.ids)
            if job.extend:  # the samples files show the episode's opening messages (rollout_env.assemble)
                e.opening = list(job.extend[0])
        else:
            e.add(job.ids[len(e.prompt) + len(e.ids):], None)  # what the agent inserted: context, no loss
        e.add(list(ids), [float(x) for x in logps])
        if message is not None:
            e.tool_calls += len(message.get("tool_calls", []))
            content = TOOL_CALL.sub("", message["content"]).strip() if "tool_calls" in message else message["content"]
            returned = {**message, "content": content or None}
            record.last = (job.extend[0], returned, job.extend[1], how == "eos")
        else:
            record.last = None
