"""exhaustion: grow the heap 8 MB at a time (breach above memory_mb = 128)."""
# form: call
blocks = []
try:
    while len(blocks) < 64:
        blocks.append(bytearray(8 << 20))
except MemoryError:
    pass
if len(blocks) * 8 > 128:
    def add(a, b):
        return a + b
