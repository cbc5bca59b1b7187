//! `capexec mcp`: capexec as an MCP server (issue 38).

pub mod files;
