"""exhaustion (stdin/stdout form): hang on every input."""
# form: io
while True:
    pass
