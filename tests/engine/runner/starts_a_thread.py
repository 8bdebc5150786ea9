"""A module that starts a thread when imported: the fork server must refuse to fork after preloading it."""

import threading
import time

threading.Thread(target=lambda: time.sleep(60), daemon=True).start()
