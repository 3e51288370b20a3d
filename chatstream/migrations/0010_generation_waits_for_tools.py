from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('chatstream', '0009_tool_calls'),
    ]

    operations = [
        migrations.AddField(
            model_name='generation',
            name='waits_for_tools',
            field=models.BooleanField(default=False, help_text="The previous step's tool calls have not all ended: this step may not start yet.", verbose_name='waits for tools'),
        ),
    ]
