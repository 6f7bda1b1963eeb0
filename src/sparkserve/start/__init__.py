"""`sparkserve start`: the launchers' one step into Python (cli), above launch/, fetch/ and guard/,
which it puts together."""
