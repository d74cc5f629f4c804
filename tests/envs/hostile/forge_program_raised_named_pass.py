"""status forgery: the program itself raises, at import, an exception named 'pass' (a status that
named the program's exception became 'pass' for every test)."""
# form: call
raise type("pass", (Exception,), {})()
