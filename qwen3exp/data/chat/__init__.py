"""Conversations: records (`records`), rendered with their trained mask (`render`), checked
(`files`), packed (`packing`)."""
