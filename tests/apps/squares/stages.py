from gearbus import Task


class Square(Task):
    def on_next(self, record):
        self.emit(record.value * record.value)
