"""The peer's side of the comparison in infra/bench.sh: a LangGraph graph
that answers its input, as the `echo` agent does."""

from typing import TypedDict

from langgraph.graph import END, START, StateGraph


class State(TypedDict):
    text: str


def echo(state: State) -> State:
    return {"text": state["text"]}


graph = StateGraph(State).add_node("echo", echo).add_edge(START, "echo").add_edge("echo", END).compile()
