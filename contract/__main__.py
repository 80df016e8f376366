"""`python -m contract`: the contract as a Markdown table."""

from contract import table

print(table())
