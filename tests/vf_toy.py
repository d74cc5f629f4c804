"""A verifiers 0.4 taskset for tests, loaded by id as an installed one is (``vf.load_environment``):
sums to answer, single-turn (``kind=single``) or with an ``add`` tool served over MCP
(``kind=tool``), scored by a hand-checkable reward that logs what it computed."""

import json

import verifiers.v1 as vf


class SumData(vf.TaskData):
    answer: str


class SumTaskConfig(vf.TaskConfig):
    log: str = ""  # a file each scored episode appends {prompt, reply, reward} to
    fail_odd: bool = False  # the reward raises on the tasks with an odd first addend


def graded(reply: str, answer: str) -> float:
    """1 for the answer in the reply, else the reply's length mod 4, quartered: it varies by sample."""
    return 1.0 if answer in reply else (len(reply) % 4) / 4


class SumTask(vf.Task[SumData, vf.State, SumTaskConfig]):
    @vf.stop
    async def answered(self, trace: vf.Trace) -> bool:
        return bool(trace.last_reply)  # a reply without a tool call ends it

    @vf.reward(weight=1.0)
    async def right(self, trace: vf.Trace) -> float:
        first = int(self.data.prompt.split()[2])
        fails = self.config.fail_odd and first % 2
        reward = None if fails else graded(trace.last_reply or "", self.data.answer)
        if self.config.log:  # reward null: it raised
            with open(self.config.log, "a") as f:
                f.write(json.dumps({"prompt": self.data.prompt, "reply": trace.last_reply, "reward": reward}) + "\n")
        if fails:
            raise RuntimeError(f"the reward broke on an odd addend ({first})")
        return reward


class AddToolset(vf.Toolset[vf.SharedToolsetConfig]):
    TOOL_PREFIX = "calc"

    @vf.tool
    async def add(self, a: int, b: int) -> str:
        """Add two integers."""
        return str(a + b)


class SumConfig(vf.TasksetConfig):
    kind: str = "single"
    split: str = "train"
    task: SumTaskConfig = SumTaskConfig()
    tools: vf.SharedToolsetConfig = vf.SharedToolsetConfig()


class SumTaskset(vf.Taskset[SumTask, SumConfig]):
    @classmethod
    def toolsets(cls, config: SumConfig) -> list[vf.Toolset]:
        return [AddToolset(config.tools)] if config.kind == "tool" else []

    def load(self) -> list[SumTask]:
        offset = 10 if self.config.split == "test" else 0  # held-out sums start at 10
        return [SumTask(SumData(prompt=f"What is {a + offset} + {b}?", answer=str(a + offset + b)), self.config.task)
                for a in range(5) for b in range(5)]


__all__ = ["SumTaskset"]


if __name__ == "__main__":
    AddToolset.run()
