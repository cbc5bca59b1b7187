"""Providers that let agent frameworks use capexec as their sandbox.

- `capexec.integrations.deepagents`: a deepagents `SandboxBackendProtocol`
  backend (`pip install 'capexec[deepagents]'`);
- `capexec.integrations.openai_agents`: an OpenAI Agents SDK sandbox client
  (`pip install 'capexec[openai-agents]'`).

Each module imports its framework, so import the one you use.
"""
