"""The admin and user commands that are not hooks: status, netcheck, demo."""
