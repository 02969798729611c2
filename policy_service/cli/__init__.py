"""The `policy-service` command line (commands.py parses arguments; each command
has its own module). It sits above both packages: it may import `algorithms`,
which no other part of `policy_service` does."""
